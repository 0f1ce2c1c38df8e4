"""A parameter that no rank uses keeps no gradient (None, as under DDP), so AdamW's weight decay leaves it
alone: unchanged after a training step on 1 and on 2 processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.launch import free_port
from jagg_engine.train.trainer import Trainer

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests" / "plugins"))
import spare_param  # noqa: E402, F401  (registers linear-toy-spare)

ARGS = ["backbone=linear-toy-spare", "rewards={brightness: 1.0}", "prompts_per_step=2", "group_size=4"]
ARGS += ["sampling_steps=6", "sde_window_end=4", "window=4", "eval_every=0", "sample_every=0"]
ARGS += ["checkpoint_every=0", "lr=1e-2", "weight_decay=0.1"]


def test_unused_parameter_unchanged_after_a_step_one_process(tmp_path):
    cfg = load_config(None, ARGS, check_environment=False)
    store = open_store(tmp_path)
    t = Trainer(cfg, store.create_run(cfg.name, cfg.to_dict(), tmp_path / "run"), str(tmp_path))
    assert any(p is t.model.spare for g in t.optimizer.param_groups for p in g["params"])  # it is trainable
    spare, used = t.model.spare.detach().clone(), t.model.theta0.detach().clone()
    t.train_step(1)
    assert t.model.spare.grad is None and torch.equal(t.model.spare.detach(), spare)
    assert not torch.equal(t.model.theta0.detach(), used)  # the step did move the used weights


def test_unused_parameter_unchanged_after_a_step_two_processes(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(free_port()), str(ROOT / "tests/dist/unused_param.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world"] == 2 and result["spare_in_optimizer"] and result["used_changed"]
    assert result["spare_grad_none"] and result["spare_unchanged"]
