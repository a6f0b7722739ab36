"""A task as Lightning's data module. Tasks (tasks/) are distributions and their references, and
know nothing of Lightning (composing a config and checking it builds one: `run
print_config=true` stays clear of Lightning's import); this adapter is what a Trainer fits and
tests with."""
from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from tasks.base import Batch, Task


class TaskData(L.LightningDataModule):
    """The training stream and the held-out set of `task`, at the trainer's rank and step."""

    def __init__(self, task: Task):
        super().__init__()
        self.task = task

    def prepare_data(self) -> None:
        self.task.prepare_data()

    def setup(self, stage: str) -> None:
        self.task.setup(stage)

    def train_dataloader(self):
        trainer = self.trainer  # a resumed run continues the stream where it stopped
        return self.task.train_loader(trainer.global_step, trainer.global_rank,
                                      trainer.strategy.root_device)

    def test_dataloader(self):
        return self.task.test_loader(self.trainer.global_rank, self.trainer.world_size)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """Every tensor of a Batch (and of the test loader's index batches) copied to the device
        without blocking: Lightning's own copy would treat a Batch as one object with a `to` and
        call it blocking, a host synchronisation per tensor and step."""
        if isinstance(batch, (Batch, Tensor)):
            return batch.to(device, non_blocking=True)
        if isinstance(batch, (tuple, list)):
            return type(batch)(self.transfer_batch_to_device(b, device, dataloader_idx)
                               for b in batch)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.trainer.testing:  # indices of held-out sequences
            return batch, self.task.held_out_rows(batch)
        return batch  # a training Batch, already on the device
