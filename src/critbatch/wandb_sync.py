"""`make wandb-sync`: upload every offline W&B run that is not uploaded yet.

    python -m critbatch.wandb_sync [DIRS...]

Training runs keep theirs in `<run dir>/wandb/offline-run-*`, the analyses in
`<report folder>/wandb/offline-run-*`, and a report folder can be anywhere (`--out`). So the
search covers this folder (`.`, without `.venv` and `.git`), `runs/` (also when it is a link to
another disk) and DIRS, e.g. report folders written outside the checkout. A run counts as
uploaded when W&B has left its `<file>.wandb.synced` marker. With nothing to upload it says so
and exits 0 without starting W&B (no login needed); otherwise it names each run, then hands them
to `wandb sync`, which needs `wandb login` once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SKIPPED = {".venv", ".git", "node_modules", "__pycache__"}  # never hold a run, can be large


def offline_runs(roots: list[Path]) -> list[Path]:
    """Every `.../wandb/offline-run-*` folder below `roots` (each once, sorted)."""
    found: dict[Path, Path] = {}
    for root in roots:
        for folder, subfolders, _ in os.walk(root):
            here = Path(folder)
            if here.name.startswith("offline-run-") and here.parent.name == "wandb":
                found.setdefault(here.resolve(), here)
                subfolders.clear()
            else:
                subfolders[:] = [s for s in subfolders if s not in SKIPPED]
    return sorted(found.values())


def uploaded(run: Path) -> bool:
    """True when every .wandb file of `run` carries W&B's `.synced` marker."""
    files = list(run.glob("*.wandb"))
    return bool(files) and all(f.with_name(f.name + ".synced").exists() for f in files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make wandb-sync", description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="*", help="more folders to search (DIRS=...)")
    args = parser.parse_args(argv)
    missing = [d for d in args.dirs if not Path(d).is_dir()]
    if missing:
        print(f"critbatch: error: DIRS: {', '.join(missing)} is not a folder", file=sys.stderr)
        return 2
    runs = offline_runs([Path("."), Path("runs"), *map(Path, args.dirs)])
    todo = [run for run in runs if not uploaded(run)]
    searched = " ".join([".", "runs/", *args.dirs])
    if not todo:
        print(f"wandb-sync: nothing to upload ({len(runs)} offline W&B run(s) under {searched}, "
              "all uploaded)")
        return 0
    print(f"wandb-sync: {len(todo)} offline W&B run(s) to upload"
          f"{f' ({len(runs) - len(todo)} already uploaded)' if len(runs) > len(todo) else ''}:")
    for run in todo:
        print(f"  {run}")
    wandb = Path(sys.executable).with_name("wandb")
    command = [str(wandb) if wandb.exists() else "wandb", "sync", *map(str, todo)]
    print(" ".join(command[:2]) + " ...", flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    raise SystemExit(main())
