"""A session's data as session jobs: the opened data sources by role (evaluation falls back to the
calibration data, training data to all of it, shuffled), replacing one, and the check that the
model takes their inputs.

Functions of a :class:`~workbench.session.Session` (its methods call them), like
:mod:`workbench.session.tensorrt`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workbench.quant.batches import input_shapes, model_inputs, run_model
from workbench.session.errors import SessionError
from workbench.session.events import SessionEvent
from workbench.sources.data_source import DataSource, DataSpec, check_input, open_data
from workbench.sources.errors import SourceError

if TYPE_CHECKING:
    from workbench.session.core import Session

__all__ = ["data", "set_data", "check_forward"]


def data(session: Session, role: str = "calibration") -> DataSource:
    """The opened data source for ``role`` (evaluation falls back to calibration data; training data to
    all of the calibration data, shuffled)."""
    if role == "evaluation" and "evaluation" not in session.project.data:
        role = "calibration"
    if role == "training" and "training" not in session.project.data and "calibration" in session.project.data:
        spec = DataSpec.from_dict({**session.project.data["calibration"].to_dict(), "num_batches": None,
                                   "shuffle": True})
        cached = session._data.get("training")
        if cached is None or cached.spec != spec:  # follows a change of the calibration data
            session._data["training"] = open_data(spec, trust_code=session.trust_code, base_dir=session.base_dir)
        return session._data["training"]
    if role not in session.project.data:
        raise SessionError(f"The project has no {role} data.")
    if role not in session._data:
        session._data[role] = open_data(session.project.data[role], trust_code=session.trust_code,
                                        base_dir=session.base_dir)
    return session._data[role]


def set_data(session: Session, role: str, spec: DataSpec) -> None:
    """Replace a data source; the new inputs must fit the model (new calibration data is run through it
    once, as :meth:`create` does). A refused source leaves the project's data as it was."""
    source = open_data(spec, trust_code=session.trust_code, base_dir=session.base_dir)
    if session.project.input_spec is not None:
        check_input(session.project.input_spec, source.input_spec(), spec.label)
    previous = session.project.data.get(role), session._data.get(role)
    session.project.data[role] = spec
    session._data[role] = source
    if role == "calibration":
        try:
            session.check_forward()
        except SourceError:
            for store, old in ((session.project.data, previous[0]), (session._data, previous[1])):
                if old is None:
                    store.pop(role, None)
                else:
                    store[role] = old
            raise
    session._changed(SessionEvent.DATA, role=role)


def check_forward(session: Session) -> None:
    """Run the float model on one sample batch; its error names the inputs' shapes and dtypes."""
    sample = session.sample_inputs(batch=2)
    try:
        with torch.no_grad():
            run_model(session.float_model, (sample, None), session.device)
    except Exception as error:
        raise SourceError(f"The model ({session.project.model.label}) failed on a sample input of shape "
                          f"{input_shapes(*model_inputs((sample, None)))} from "
                          f"{session.project.data['calibration'].label}: {type(error).__name__}: {error}") from error
