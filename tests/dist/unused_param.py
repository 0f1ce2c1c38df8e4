"""Two trainer processes under `accelerate launch` (gloo): one training step of a model with a parameter that no
rank uses, with weight decay. Rank 0 writes to argv[1] whether that parameter was left as it was."""

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).parents[1] / "plugins"))
import spare_param  # noqa: E402, F401  (registers linear-toy-spare)

from jagg_engine.train.config import load_config  # noqa: E402
from jagg_engine.train.trainer import Trainer  # noqa: E402

ARGS = ["backbone=linear-toy-spare", "rewards={brightness: 1.0}", "prompts_per_step=2", "group_size=4"]
ARGS += ["sampling_steps=6", "sde_window_end=4", "window=4", "eval_every=0", "sample_every=0"]
ARGS += ["checkpoint_every=0", "processes=2", "lr=1e-2", "weight_decay=0.1"]


def main(out: str) -> None:
    acc = Accelerator(cpu=True)
    runs = Path(out).parent
    cfg = load_config(None, ARGS, check_environment=False)
    t = Trainer(cfg, 0, str(runs), accelerator=acc, run_dir=runs / "run")
    spare_before = t.model.spare.detach().clone()
    used_before = t.model.theta0.detach().clone()
    t.train_step(1)
    if acc.is_main_process:
        result = {
            "world": t.world,
            "spare_unchanged": bool(torch.equal(t.model.spare.detach(), spare_before)),
            "spare_grad_none": t.model.spare.grad is None,
            "spare_in_optimizer": any(
                p is t.model.spare for g in t.optimizer.param_groups for p in g["params"]
            ),
            "used_changed": not torch.equal(t.model.theta0.detach(), used_before),
        }
        Path(out).write_text(json.dumps(result))
    acc.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
