"""The CLI at its boundary: every bad value is one line on stderr and exit 2, refused before
any work is done; sampling flags without --sample are named; the provider is stated."""

import pytest
from click.testing import CliRunner

from seqexport.cli import cli

CASES = {
    "ids beyond int64": (["--ids", "99999999999999999999999"], "beyond int64"),
    "negative seed": (["--text", "5 March 2021", "--sample", "--seed", "-1"], "--seed"),
    "float top-k": (["--ids", "5 6", "--sample", "--top-k", "2.5"], "--top-k"),
    "past the positional table": (["--ids", "5 6", "--max-new-tokens", "600"],
                                  "max_new_tokens 600 exceeds what the model can hold: its decoder has 512 positions"),
    "empty text": (["--text", ""], "--text #1 is empty"),
    "empty ids": (["--ids", ""], "expected at least one token id"),
    "text and ids": (["--ids", "5", "--text", "x"], "one of them"),
    "token out of range": (["--ids", "5 6 100"], "token id 100"),
    "unknown option": (["--ids", "5", "--bogus"], "No such option '--bogus'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_generate_refuses_bad_input_in_one_line(transformer_tiny, case):
    args, message = CASES[case]
    result = CliRunner().invoke(cli, ["generate", str(transformer_tiny[1]), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_sampling_flags_without_sample_are_named_and_provider_stated(transformer_tiny):
    result = CliRunner().invoke(cli, ["generate", str(transformer_tiny[1]), "--ids", "5 6", "--temperature", "0.5",
                                      "--top-k", "3", "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert "warning: --temperature, --top-k apply to sampling only; add --sample" in result.stderr
    assert "on CPUExecutionProvider" in result.stderr
    assert len(result.stdout.split()) <= 3


@pytest.mark.parametrize("command", [["validate", "{f}", "--report", "{bad}"], ["bench", "{f}", "--fast", "--json", "{bad}"]])
def test_output_paths_are_checked_before_the_work(transformer_tiny, tmp_path, command):
    folder = transformer_tiny[1]
    manifest = (folder / "manifest.json").read_bytes()
    bad = str(tmp_path / "nonexistent" / "out.json")
    result = CliRunner().invoke(cli, [a.format(f=folder, bad=bad) for a in command])
    assert result.exit_code == 2 and "does not exist" in result.output, result.output
    assert result.output.count("\n") == 1
    assert (folder / "manifest.json").read_bytes() == manifest  # validate did not run
