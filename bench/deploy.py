"""Image sizes for bench/results/deploy.json: `make images`, then the size of each image's root filesystem.

Usage: python bench/deploy.py [--force]   (--force rebuilds every image and records the warm build times)

Uncompressed size = the layer tar (the unpacked root filesystem), compressed = the gzip layer blob, both MiB.
Other deploy.json metrics (issue 22's end-to-end figures) are kept: only the image entries are replaced.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "deploy.json"


def main() -> None:
    args = [sys.executable, "-m", "tether.devenv.images", "--json", *sys.argv[1:]]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    figures: dict[str, tuple[float, str]] = {}
    for line in out.splitlines():
        image = json.loads(line)
        name = image["name"]
        figures[f"{name}_image_mib"] = (round(image["uncompressed_bytes"] / 2**20, 1), "MiB")
        figures[f"{name}_image_compressed_mib"] = (round(image["compressed_bytes"] / 2**20, 1), "MiB")
    existing = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    kept = [entry for entry in existing if entry["metric"] not in figures]
    entries = [{"metric": m, "value": v, "unit": u} for m, (v, u) in figures.items()]
    RESULTS.write_text(json.dumps(entries + kept, indent=2) + "\n")
    for entry in entries:
        print(f"{entry['metric']}: {entry['value']} {entry['unit']}")


if __name__ == "__main__":
    main()
