"""`python -m experiments.sync <results>`: replays rows recorded without W&B (logger == "local") into W&B runs,
one per point, with the point's group (sweep_id), job_type (backend) and resolved config. Offline unless
WANDB_MODE says otherwise. Rows already logged to W&B are left alone."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from harness import store, wandb_log


def sync(results: Path, project: str = "ssd-kernels", entity: str | None = None, directory: Path = Path("."),
         mode: str = "offline") -> list[str]:
    df = store.load(results)
    local = df[df["logger"] != "wandb"]
    runs = []
    for _, rows in local.groupby("run_id", sort=False):
        first = rows.iloc[0]
        config = yaml.safe_load(first["config"]) if isinstance(first["config"], str) else {}
        run = wandb_log.start(project=project, entity=entity, group=first["sweep_id"], job_type=first["backend"],
                              name=f"{first['backend']}-{first['config_hash']}", config=config,
                              directory=wandb_log.wandb_dir(str(directory), Path.cwd()), mode=mode)
        wandb_log.finish(run, rows, {**wandb_log.summary_metrics(rows), "synced_from": "parquet"})
        runs.append(run.id)
    if runs:
        import wandb

        wandb.teardown()  # flushes the offline records to disk before we return
    return runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, help="a Parquet file or a directory of them")
    parser.add_argument("--project", default="ssd-kernels")
    parser.add_argument("--entity", default=None)
    parser.add_argument("--dir", type=Path, default=Path("."), help="W&B writes under <dir>/wandb/")
    parser.add_argument("--mode", default="offline", help="used when WANDB_MODE is not set")
    args = parser.parse_args(argv)
    runs = sync(args.results, args.project, args.entity, args.dir, args.mode)
    print(f"[sync] {len(runs)} runs replayed into W&B")


if __name__ == "__main__":
    main()
