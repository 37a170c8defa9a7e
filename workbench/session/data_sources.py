"""A session's data: the opened data sources by role (evaluation falls back to the calibration data,
training data to all of it, shuffled), replacing one, and the check that the model takes their inputs.

:class:`DataSources` is the cache of opened sources the :class:`~workbench.session.Session` owns; it is
given the project and the trust it opens them with, and knows nothing of the session.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.project import Project
from workbench.quant.algorithms.batches import first_samples, input_shapes, model_inputs, run_model, to_device
from workbench.session.errors import SessionError
from workbench.sources.data_source import DataSource, DataSpec, InputSpec, check_input, open_data
from workbench.sources.errors import SourceError
from workbench.sources.shapes_only import shapes_mode

__all__ = ["DataSources", "check_forward", "checked_input_spec", "sample_inputs", "example_inputs"]

logger = logging.getLogger(__name__)


class DataSources:
    """The data sources opened for a project, by role, each opened once (until :meth:`clear`)."""

    def __init__(self) -> None:
        self._opened: dict[str, DataSource] = {}

    def clear(self) -> None:
        """Forget every opened source (the project's paths moved, or another process changed its data)."""
        self._opened.clear()

    def get(self, project: Project, role: str, *, trust_code: bool, base_dir: Path) -> DataSource:
        """The opened data source for ``role`` of ``project`` (evaluation falls back to calibration data;
        training data to all of the calibration data, shuffled)."""
        if role == "evaluation" and "evaluation" not in project.data:
            role = "calibration"
        if role == "training" and "training" not in project.data and "calibration" in project.data:
            spec = DataSpec.from_dict({**project.data["calibration"].to_dict(), "num_batches": None,
                                       "shuffle": True})
            cached = self._opened.get("training")
            if cached is None or cached.spec != spec:  # follows a change of the calibration data
                self._opened["training"] = open_data(spec, trust_code=trust_code, base_dir=base_dir)
            return self._opened["training"]
        if role not in project.data:
            raise SessionError(f"The project has no {role} data.")
        if role not in self._opened:
            self._opened[role] = open_data(project.data[role], trust_code=trust_code, base_dir=base_dir)
        return self._opened[role]

    def replace(self, project: Project, role: str, spec: DataSpec, *, trust_code: bool, base_dir: Path,
                check: Callable[[], None]) -> None:
        """Make ``spec`` the project's ``role`` data; its inputs must fit the project's input, and for the
        calibration data ``check`` (a forward pass through the model) must pass. A refused source leaves the
        project's data (and these sources) as they were."""
        source = open_data(spec, trust_code=trust_code, base_dir=base_dir)
        if project.input_spec is not None:
            check_input(project.input_spec, source.input_spec(), spec.label)
        previous = project.data.get(role), self._opened.get(role)
        project.data[role] = spec
        self._opened[role] = source
        if role != "calibration":
            return
        try:
            check()
        except SourceError:
            for store, old in ((project.data, previous[0]), (self._opened, previous[1])):
                if old is None:
                    store.pop(role, None)
                else:
                    store[role] = old
            raise


def check_forward(model: nn.Module, sample: Any, device: torch.device | None, project: Project) -> None:
    """Run the float ``model`` on ``sample`` (a batch of the project's calibration data) on ``device`` (None: where
    the sample is, meta for a run on shapes only); its error names the inputs' shapes and dtypes."""
    try:
        with torch.no_grad(), shapes_mode(sample):
            run_model(model, (sample, None), device)
    except Exception as error:
        raise SourceError(f"The model ({project.model.label}) failed on a sample input of shape "
                          f"{input_shapes(*model_inputs((sample, None)))} from "
                          f"{project.data['calibration'].label}: {type(error).__name__}: {error}") from error


def checked_input_spec(project: Project, source: Callable[[str], DataSource],
                       declared: Sequence[int] | None = None) -> InputSpec:
    """A new project's input, read from its calibration data (``source(role)``: the opened data source of a
    role); ``declared`` (the shape a user gave) must agree with it, and every other data set must fit it now, not
    as an error in a later job."""
    data_spec = source("calibration").input_spec()
    if declared is not None:
        check_input(InputSpec(tuple(int(s) for s in declared)), data_spec, project.data["calibration"].label)
    for role, spec in project.data.items():
        if role != "calibration":
            check_input(data_spec, source(role).input_spec(), spec.label)
    return data_spec


def sample_inputs(source: DataSource, device: torch.device, batch: int = 1) -> Any:
    """The first ``batch`` samples of ``source`` on ``device``: a tensor, or a dict of keyword inputs."""
    inputs, _ = next(iter(source.batches(limit=1)))
    return first_samples(to_device(inputs, device), batch)


def parity_batches(source: DataSource, device: torch.device, count: int) -> list[Any]:
    """The inputs of the first ``count`` batches of ``source`` on ``device`` (an export checks parity on them)."""
    if count <= 0:
        return []
    return [to_device(inputs, device) for inputs, _ in source.batches(limit=count)]


def example_inputs(sample: Callable[..., Any]) -> Any:
    """One sample (``sample(batch=1)``), for the functional rewrite's check of traced modules; None without usable
    data."""
    try:
        return sample(batch=1)
    except Exception as error:  # no data yet, or data the model cannot take: build without the check
        logger.info("No sample input to check traced modules with: %s", error)
        return None
