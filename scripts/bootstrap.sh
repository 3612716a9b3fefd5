#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, the Python environment and the cached
# Kubernetes binaries. Every step is skipped when its result is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# Redis Sentinel (the failover test, bench/sentinel_failover.py): three sentinels watch a master and a replica.
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
# The web console: npm fetches its browser libraries; the browser tests drive Debian's Chromium.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
# The workspace access tests run the workspace's editor in a network namespace (ip netns, veth).
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
# The front proxy before kas' agent listener (deploy/front-proxy/, `tether up --front-proxy`, its tests).
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
# The development cluster's real node (`tether dev cluster up --real-nodes N`, tests/node): containerd and runc
# run its containers, the CNI plugins wire pods to a bridge, iptables serves kube-proxy, and busybox-static is the
# one binary of the local pause and test images.
command -v containerd >/dev/null 2>&1 || missing+=(containerd)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing+=(iptables)
dpkg-query -W -f="\${Status}" busybox-static 2>/dev/null | grep -q "ok installed" || missing+=(busybox-static)
# Container images (make images): a Debian rootfs without a daemon, the OCI layout, runc (above) to try the image.
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v strip >/dev/null 2>&1 || missing+=(binutils)
# The workspace tools-injector image (tether_devenv.tools_image): its Python loads the loader it ships.
command -v patchelf >/dev/null 2>&1 || missing+=(patchelf)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The console's browser libraries (package-lock.json) from the npm registry, served by the hub as static files:
# nothing is loaded from a CDN at run time.
VENDOR=src/tether/hub/console/static/vendor
if [ ! -f "$VENDOR/.package-lock.json" ] || ! cmp -s package-lock.json "$VENDOR/.package-lock.json"; then
  echo "bootstrap: installing the web console's browser libraries (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
  mkdir -p "$VENDOR"
  cp node_modules/htmx.org/dist/htmx.min.js node_modules/cytoscape/dist/cytoscape.min.js "$VENDOR/"
  cp node_modules/asciinema-player/dist/bundle/asciinema-player.min.js \
    node_modules/asciinema-player/dist/bundle/asciinema-player.css "$VENDOR/"
  cp package-lock.json "$VENDOR/.package-lock.json"
fi

# `python3 -m uv` works whether or not the uv script landed on PATH (pyenv shims need a rehash).
if ! python3 -m uv --version >/dev/null 2>&1; then
  echo "bootstrap: installing uv (Python package manager) from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check uv
fi

python3 -m uv sync --frozen --quiet --python python3.11

# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok, then the real node's
# kubelet, kube-proxy, CoreDNS and local-path-provisioner, once per machine (cached under ~/.cache/tether);
# prints progress, returns at once when cached.
.venv/bin/tether dev cluster build

# helm, built from its Go module once per machine (cached under ~/.cache/tether/helm): the charts' tests use it.
.venv/bin/python -m tether_devenv.helm

# Jaeger v2 (an OpenTelemetry Collector), built from its Go module once per machine (cached under
# ~/.cache/tether/jaeger): the trace collector of the tracing test (tests/e2e/test_tracing.py) and bench/tracing.py.
.venv/bin/python -m tether_devenv.jaeger

# Builds upstream GitLab kas, agentk and glab from ../shared/upstream once per machine (cached under
# ~/.cache/tether/upstream), the peers of the interop tests; prints progress, returns at once when cached.
.venv/bin/tether dev upstream build
