"""Training on a GPU (`train --device cuda`): the flag's errors, the card's record of the device, and (with a GPU)
steps there that follow the CPU's and checkpoints that resume on the CPU."""
from __future__ import annotations

import json

import pytest
import torch

from tinychat.training.card import _threads_text, train_command
from tinychat.training.train import Trainer, latest_checkpoint
from training_support import tiny_cfg, tiny_sets, tok


def test_a_device_this_torch_cannot_use_is_a_one_line_error(tmp_path):
    from tinychat.training.__main__ import main
    for dev, says in (("tpu", "expected cpu or cuda[:N]"), ("meta", "runs on cpu or cuda"),
                      *((("cuda", "sees no CUDA GPU"),) if not torch.cuda.is_available() else ())):
        with pytest.raises(SystemExit) as e:      # SystemExit(message): Python prints it, exit status 1
            main(["train", "--device", dev, "--shards", str(tmp_path / "none"), "--run", str(tmp_path / "run")])
        assert isinstance(e.value.code, str) and "\n" not in e.value.code and says in e.value.code
        assert not (tmp_path / "run").exists()        # refused before anything is written


def test_the_card_names_the_gpu_a_stage_ran_on_and_its_command_asks_for_one():
    state = {"config": tiny_cfg().to_dict(), "threads": 2, "device_log": [[0, "cuda (NVIDIA H200)"]]}
    assert "--device cuda" in train_command(state, "runs/v11", ["data/shards-8"])
    assert _threads_text(state) == "cuda (NVIDIA H200)"
    moved = {**state, "device_log": [[0, "cuda (NVIDIA H200)"], [900, "cpu"]]}
    assert _threads_text(moved) == "cuda (NVIDIA H200), then cpu from step 900"
    assert "--device" not in train_command(moved, "runs/v11", ["data/shards-8"])    # it ended on the CPU
    cpu = {"config": tiny_cfg().to_dict(), "threads": 2}
    assert "--device" not in train_command(cpu, "runs/v11", ["data/shards-8"]) and _threads_text(cpu) == "2 CPU threads"


def test_a_cpu_run_records_no_device_in_its_checkpoints(tmp_path):
    train, val = tiny_sets(20)
    tr = Trainer(tiny_cfg(steps=2), tok(), train, val, tmp_path / "run", log=lambda *_: None, device="cpu")
    tr.fit(progress=False)
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert "device_log" not in state and state["step"] == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_steps_on_the_gpu_follow_the_cpu_and_its_checkpoint_resumes_on_the_cpu(tmp_path):
    train, val = tiny_sets(30)
    cfg = tiny_cfg(steps=6, bf16=False)       # fp32 both sides: the paths differ by summation order only
    runs = {}
    for dev in ("cpu", "cuda"):
        tr = Trainer(cfg, tok(), train, val, tmp_path / dev, log=lambda *_: None, device=dev)
        runs[dev] = [tr.train_step()["loss"] for _ in range(3)]
        tr.save_checkpoint()
    assert runs["cpu"] == pytest.approx(runs["cuda"], rel=2e-3)
    back = Trainer.resume(tmp_path / "cuda", tok(), train, val, log=lambda *_: None, device="cpu")
    assert next(back.model.parameters()).device.type == "cpu" and back.step == 3
    assert back.device_log == [[0, f"cuda ({torch.cuda.get_device_name()})"], [3, "cpu"]]
    back.fit(progress=False)
    assert back.step == 6
    # bf16 autocast on the GPU: the fused head's loss stays close to the CPU's
    gpu = Trainer(tiny_cfg(steps=6), tok(), train, val, tmp_path / "bf16", log=lambda *_: None, device="cuda")
    cpu = Trainer(tiny_cfg(steps=6), tok(), train, val, tmp_path / "bf16c", log=lambda *_: None)
    assert gpu.evaluate() == pytest.approx(cpu.evaluate(), rel=2e-2)
