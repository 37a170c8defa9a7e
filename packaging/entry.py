"""Entry script of the frozen app (PyInstaller): the ``workbench`` command, the GUI when run bare.

Started from a file manager or the desktop menu the app gets no arguments, and the desktop file
passes ``gui %f``; from a terminal every CLI command works as with the pip-installed ``workbench``.
"""
import sys

from workbench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["gui"]))
