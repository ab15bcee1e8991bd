"""instruments.host_profile: its arguments are checked before anything runs, and it says why it cannot run without
a GPU (the timing itself runs on the H200)."""

import pytest

from instruments import host_profile


@pytest.mark.parametrize("argv, word", [
    (["--shape", "1,2,3"], "--shape"),
    (["--calls", "1"], "--calls"),
    (["--dtype", "float64"], "--dtype"),
    (["--switches", "tma"], "--switches"),
    (["--switches", "tma="], "--switches"),
], ids=["shape-of-three", "one-call", "float64", "switch-without-value", "switch-with-empty-value"])
def test_bad_arguments_are_refused_naming_them(argv, word, capsys):
    with pytest.raises(SystemExit):
        host_profile.main(argv)
    assert word in capsys.readouterr().err


def test_without_cuda_it_says_it_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(host_profile.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        host_profile.main(["--backends", "reference"])


@pytest.mark.parametrize("argv, message", [
    (["--backends", "reference", "--switches", "tma=true"], "switch 'tma': backend 'reference' has no such switch"),
    (["--backends", "reference,nope"], "'nope'"),
], ids=["switch-the-backend-lacks", "unknown-backend-after-a-known-one"])
def test_every_backend_is_built_before_any_is_profiled(argv, message, monkeypatch, capsys):
    def profiled(*args, **kwargs):
        raise AssertionError("a backend was profiled before the arguments were checked")

    monkeypatch.setattr(host_profile.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(host_profile, "report", profiled)
    with pytest.raises(SystemExit):
        host_profile.main(argv)
    assert message in capsys.readouterr().err


def test_headline_inputs_match_the_shape():
    import torch

    shape = (2, 16, 4, 8, 1, 8, 16)
    x, dt, A, B, C, D, dt_bias = host_profile.headline_inputs(shape, torch.float32, torch.device("cpu"))
    assert x.shape == (2, 16, 4, 8) and dt.shape == (2, 16, 4) and B.shape == C.shape == (2, 16, 1, 8)
    assert A.shape == D.shape == dt_bias.shape == (4,) and bool((A < 0).all())


def test_switches_are_read_as_yaml_scalars():
    got = host_profile.parse_switches("tma=true, tma_descriptors=host,occupancy=2")
    assert got == {"tma": True, "tma_descriptors": "host", "occupancy": 2}
