"""Tiny stand-ins of Hugging Face's Trainer, accelerate and Lightning's Trainer for the tests
of where a framework's syncs are placed and which levers fix them (CI has none installed).
Each is written under a `site-packages` folder of the test's tmp dir, so gpusync takes it for
an installed library, with the files, functions and source lines that the entries of
gpusync/detect/libraries/ (transformers.py, lightning.py) name; the scripts put that folder
first on sys.path themselves."""
import textwrap

TRANSFORMERS = {
    # accelerate's loader as transformers 5.24's Trainer gets it (accelerate/data_loader.py
    # DataLoaderShard.__iter__, non_blocking False by default)
    "accelerate/__init__.py": "",
    "accelerate/utils/__init__.py": "",
    "accelerate/utils/operations.py": """
        def send_to_device(batch, device, non_blocking=False):
            return [t.to(device, non_blocking=non_blocking) for t in batch]
        """,
    "accelerate/data_loader.py": """
        from .utils.operations import send_to_device


        class DataLoaderShard:
            def __init__(self, batches, device):
                self.batches, self.device, self._non_blocking = batches, device, False

            def __iter__(self):
                for batch in self.batches:
                    batch = send_to_device(batch, self.device, non_blocking=self._non_blocking)
                    yield batch
        """,
    "transformers/__init__.py": """
        from .trainer import Trainer
        from .training_args import TrainingArguments
        """,
    "transformers/training_args.py": """
        from dataclasses import dataclass


        @dataclass
        class TrainingArguments:
            output_dir: str
            logging_steps: int = 500
            logging_nan_inf_filter: bool = True
            accelerator_config: dict | None = None
        """,
    # Trainer._run_epoch's filter and _maybe_log_save_evaluate's read as transformers 5.24
    # writes them (transformers/trainer.py)
    "transformers/trainer.py": """
        import torch
        from accelerate.data_loader import DataLoaderShard


        class Trainer:
            def __init__(self, model, args, train_dataset):
                self.model, self.args = model, args
                self.data = DataLoaderShard(train_dataset, "cuda")
                self.data._non_blocking = (args.accelerator_config or {}).get(
                    "non_blocking", False)
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

            def train(self):
                return self._inner_training_loop()

            def _inner_training_loop(self):
                self._tr_loss = torch.tensor(0.0, device="cuda")
                for step, (x, y) in enumerate(self.data, 1):
                    self._run_epoch(x, y)
                    self._maybe_log_save_evaluate(self._tr_loss, step)

            def _run_epoch(self, x, y):
                tr_loss_step = self.training_step(x, y)
                if (
                    self.args.logging_nan_inf_filter
                    and (torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step))
                ):
                    self._tr_loss += self._tr_loss / 2
                else:
                    self._tr_loss += tr_loss_step

            def training_step(self, x, y):
                loss = ((self.model(x) - y) ** 2).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                return loss.detach()

            def _maybe_log_save_evaluate(self, tr_loss, step):
                if step % self.args.logging_steps == 0:
                    tr_loss_scalar = tr_loss.mean().item()
                    print({"loss": round(tr_loss_scalar / step, 4)})
        """,
}

# accelerate in a user's own loop, as 1.15 writes it: Accelerator.prepare wraps a DataLoader in
# a DataLoaderShard that builds its own loader with the given one's pin_memory
# (data_loader.py prepare_data_loader) and moves each batch with send_to_device(...,
# non_blocking=DataLoaderConfiguration.non_blocking)
ACCELERATE = {
    "accelerate/__init__.py": """
        from .accelerator import Accelerator
        from .utils import DataLoaderConfiguration
        """,
    "accelerate/utils/__init__.py": """
        from dataclasses import dataclass


        @dataclass
        class DataLoaderConfiguration:
            non_blocking: bool = False
        """,
    "accelerate/utils/operations.py": TRANSFORMERS["accelerate/utils/operations.py"],
    "accelerate/data_loader.py": """
        import torch
        from .utils.operations import send_to_device


        class DataLoaderShard:
            def __init__(self, loader, device, non_blocking):
                self.base_dataloader = torch.utils.data.DataLoader(
                    loader.dataset, batch_size=loader.batch_size, pin_memory=loader.pin_memory)
                self.device, self._non_blocking = device, non_blocking

            def __iter__(self):
                for batch in self.base_dataloader:
                    batch = send_to_device(batch, self.device, non_blocking=self._non_blocking)
                    yield batch
        """,
    "accelerate/accelerator.py": """
        import torch
        from .data_loader import DataLoaderShard
        from .utils import DataLoaderConfiguration


        class Accelerator:
            def __init__(self, dataloader_config=None):
                self.config = dataloader_config or DataLoaderConfiguration()

            def prepare(self, *objects):
                return tuple(self._prepare(o) for o in objects)

            def _prepare(self, obj):
                if isinstance(obj, torch.utils.data.DataLoader):
                    return DataLoaderShard(obj, "cuda", self.config.non_blocking)
                return obj.to("cuda") if isinstance(obj, torch.nn.Module) else obj
        """,
}

LIGHTNING = {
    "lightning/__init__.py": "",
    "lightning/pytorch/__init__.py": """
        from .core.module import LightningModule
        from .trainer.trainer import Trainer
        """,
    "lightning/pytorch/core/__init__.py": "",
    "lightning/pytorch/core/module.py": """
        import torch


        class LightningModule(torch.nn.Module):
            def log(self, name, value, prog_bar=False, on_step=None):
                self._results[name] = (value.detach(), prog_bar)
        """,
    "lightning/pytorch/trainer/__init__.py": "",
    # _ResultCollection.metrics converts what is logged with prog_bar=True as Lightning 2.6.6
    # does (trainer/connectors/logger_connector/result.py)
    "lightning/pytorch/trainer/connectors/__init__.py": "",
    "lightning/pytorch/trainer/connectors/logger_connector/__init__.py": "",
    "lightning/pytorch/trainer/connectors/logger_connector/result.py": """
        def convert_tensors_to_scalars(value):
            return value.item()


        class _ResultCollection(dict):
            def metrics(self):
                metrics = {"pbar": {}}
                for forked_name, (value, prog_bar) in self.items():
                    if prog_bar:
                        metrics["pbar"][forked_name] = convert_tensors_to_scalars(value)
                return metrics
        """,
    "lightning/pytorch/trainer/trainer.py": """
        import sys

        from .connectors.logger_connector.result import _ResultCollection


        class Trainer:
            def fit(self, model, batches, val_batches=()):
                model.to("cuda")
                optimizer = model.configure_optimizers()
                model._results = _ResultCollection()
                for batch in batches:
                    batch = [t.to("cuda", non_blocking=True) for t in batch]
                    loss = model.training_step(batch)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    self.refresh_progress_bar(model)
                for batch in val_batches:
                    model.validation_step([t.to("cuda", non_blocking=True) for t in batch])
                self.refresh_progress_bar(model)

            def refresh_progress_bar(self, model):
                print(model._results.metrics()["pbar"], file=sys.stderr)
        """,
}


def write(root, files) -> str:
    """The files under root/site-packages; that folder's path."""
    site = root / "site-packages"
    for name, text in files.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(site)


def script(site: str, body: str) -> str:
    """A user's script that imports the stand-ins from `site`."""
    return f"import sys\nsys.path.insert(0, {site!r})\n" + textwrap.dedent(body)
