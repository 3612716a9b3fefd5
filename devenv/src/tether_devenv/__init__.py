"""Local development and test environment: private Redis, PostgreSQL and a real Kubernetes cluster.

The cluster is made of upstream binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok) built once per machine from the Go module proxy and cached outside the repository
(`../shared/reference/k8s_testenv.md`).
"""
