"""Running the command line in-process, as the CLI tests do: the exit code and what it printed."""
from workbench import cli


def run(capsys, *args):
    """``workbench ARGS...`` in this process; returns (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def layer_rows(capsys, project) -> dict:
    """``workbench show --json``'s layer table, by layer name."""
    import json

    code, out, err = run(capsys, "show", project, "--json", "--trust-code")
    assert code == 0, err
    return {row["name"]: row for row in json.loads(out)["layer_table"]}
