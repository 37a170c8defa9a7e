"""The PySide6 desktop app over :mod:`workbench.session`. Every Qt import of the project lives here."""
