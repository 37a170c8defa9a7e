"""Logging helper kept from pytorch-quantization."""
import logging


def reset_logger_handler() -> None:
    """Remove all handlers of the root logger (for scripts whose logging format got mixed up)."""
    root_logger = logging.getLogger()
    while root_logger.handlers:
        root_logger.removeHandler(root_logger.handlers[0])
