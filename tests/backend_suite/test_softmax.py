"""softmax in the suite's style: ExecuTorch's suite has no softmax module, and the CI subset
the issue names includes it. Same fixture, runner and tolerances as the suite's modules."""
import torch


class Model(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.softmax(x, dim=self.dim)


def test_softmax_f32_last_dim(test_runner) -> None:
    test_runner.lower_and_run_model(Model(-1), (torch.randn(3, 29),))


def test_softmax_f32_first_dim(test_runner) -> None:
    test_runner.lower_and_run_model(Model(0), (torch.randn(7, 5),))


def test_softmax_f32_middle_dim_4d(test_runner) -> None:
    test_runner.lower_and_run_model(Model(1), (torch.randn(2, 11, 3, 5),))


def test_softmax_f32_large_values(test_runner) -> None:
    test_runner.lower_and_run_model(Model(-1), (torch.randn(5, 13) * 100,))
