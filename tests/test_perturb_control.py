"""benchmarks/perturb_control.py: the noise control writes a change of the RL update's size in a
random direction (signflip) or the opposite one (negate), checked on numbers worked by hand."""

import subprocess
import sys

import pytest
import torch
from bench_script import load
from safetensors.torch import load_file, save_file

perturb = load("perturb_control")


def test_negate_and_signflip_by_hand():
    start = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0]), "b": torch.tensor([0.5])}
    trained = {"w": torch.tensor([1.5, 2.0, 2.75, 4.25]), "b": torch.tensor([0.25])}
    neg = perturb.perturbed(start, trained, "negate", 0)
    assert torch.equal(neg["w"], torch.tensor([0.5, 2.0, 3.25, 3.75])) and torch.equal(
        neg["b"], torch.tensor([0.75])
    )
    flip = perturb.perturbed(start, trained, "signflip", 0)
    d = flip["w"] - start["w"]  # each element's change: the update's, with a sign of its own
    assert torch.equal(d.abs(), torch.tensor([0.5, 0.0, 0.25, 0.25]))
    assert perturb.perturbed(start, trained, "signflip", 0)["w"].tolist() == flip["w"].tolist()  # its seed's
    signs = [perturb.perturbed(start, trained, "signflip", s)["w"][0].item() for s in range(20)]
    assert set(signs) == {0.5, 1.5}  # both signs drawn
    with pytest.raises(SystemExit, match="different tensors"):
        perturb.perturbed(start, {"w": trained["w"]}, "negate", 0)


def test_the_script_writes_a_model_folder(tmp_path):
    for name, w in (("start", [0.0, 1.0]), ("trained", [0.5, 1.0])):
        (tmp_path / name).mkdir()
        save_file({"w": torch.tensor(w)}, str(tmp_path / name / "model.safetensors"))
        (tmp_path / name / "config.json").write_text(f'{{"name": "{name}"}}')
    script = perturb.__file__
    args = [
        "--start",
        str(tmp_path / "start"),
        "--trained",
        str(tmp_path / "trained"),
        "--out",
        str(tmp_path / "o"),
    ]
    r = subprocess.run([sys.executable, script, *args, "--mode", "negate"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "update norm 0.5, written change norm 0.5, cosine -1.0000" in r.stdout
    assert load_file(tmp_path / "o" / "model.safetensors")["w"].tolist() == [-0.5, 1.0]
    assert (tmp_path / "o" / "config.json").read_text() == '{"name": "start"}'  # the start's other files
    bad = subprocess.run([sys.executable, script, *args[:2], "--trained", str(tmp_path), *args[4:], "--mode", "negate"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0 and "model.safetensors does not exist" in bad.stderr
