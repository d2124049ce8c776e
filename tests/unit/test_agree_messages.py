"""Parity's rejection says by how much and by what tolerance it was judged, so a user can
choose --rtol / --atol (it named neither: 'final parameter 1 (50257, 256) differs')."""
import torch

from gpusync.runs.agree import Tolerance, differs, parameters


def test_a_parameter_that_differs_says_by_how_much_and_what_was_allowed():
    base = [torch.tensor([1.0, -2.0, 4.0])]
    other = [torch.tensor([1.0, -2.0, 4.0 + 2 ** -18])]
    assert parameters(base, other, 0.0, 0.0) == (
        "final parameter 1 (3,) differs from the original's by up to 3.81e-06")
    assert parameters(base, other, 1e-7, 0.0, scaled=True) == (
        "final parameter 1 (3,) differs from the original's by up to 3.81e-06, 4e-07 allowed")
    assert parameters(base, other, 1e-6, 0.0, scaled=True) is None  # 4e-06 allowed
    ints = [torch.tensor([1, 2])]
    assert parameters(ints, [torch.tensor([1, 3])], 0.0, 0.0) == (
        "final parameter 1 (2,) differs from the original's")


def test_a_rejection_names_the_tolerance_it_was_judged_by():
    record = {"losses": [1.0, 0.5], "steps": 2, "parameters": [torch.zeros(3)]}
    why = "final parameter 1 (3,) differs from the original's by up to 3.81e-06"
    fused = differs(why, Tolerance(rounding=True), record)
    assert fused == (f"differs from the original: {why} (judged within the float32 rounding of "
                     "a fused optimizer: 4 x 2 steps x eps 1.19e-07 = 9.5e-07 relative to each "
                     "loss and each parameter's largest value; --rtol / --atol: a larger "
                     "tolerance admits a change that only rounds differently)")
    assert differs(why, Tolerance(), record).endswith(
        "(judged identical; --rtol / --atol: a tolerance admits a change that only rounds "
        "differently)")
