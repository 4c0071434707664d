"""The CLI at its boundary: every bad value is one line on stderr and exit 2, refused before
any work is done; sampling flags without --sample are named; the provider is stated."""

import pytest
from click.testing import CliRunner

import seqexport.runtime as rt
from seqexport.cli import cli

CASES = {
    "ids beyond int64": (["--ids", "99999999999999999999999"], "token id 99999999999999999999999 is outside this model's vocabulary"),
    "negative seed": (["--text", "5 March 2021", "--sample", "--seed", "-1"], "--seed"),
    "float top-k": (["--ids", "5 6", "--sample", "--top-k", "2.5"], "--top-k"),
    "past the positional table": (["--ids", "5 6", "--max-new-tokens", "600"],
                                  "max_new_tokens 600 exceeds what the model can hold: its decoder has 512 positions"),
    "empty text": (["--text", ""], "--text #1 is empty"),
    "empty ids": (["--ids", ""], "expected at least one token id"),
    "an id left out between commas": (["--ids", "5,,6"], "--ids '5,,6': an empty item between commas"),
    "a trailing comma": (["--ids", "5, 6,"], "--ids '5, 6,': an empty item between commas"),
    "not an integer": (["--ids", "5 six"], "--ids '5 six': expected integers separated by spaces or commas"),
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


def test_generate_beams_and_eos_id_reach_the_search(transformer_tiny):
    """`generate --beams 3` prints what beam search gives (on prompts where it differs from
    greedy), and `--eos-id` ends a row at that token."""
    folder = transformer_tiny[1]
    model = rt.load(folder, provider="cpu")
    prompts = [[5, 6, 7], [8, 9], [11, 3, 14, 2], [20, 21]]
    beam = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=8, num_beams=3, eos_id=-1))
    greedy = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=8, eos_id=-1))
    assert beam != greedy  # a search that fell back to greedy would print greedy's rows
    args = [a for p in prompts for a in ("--ids", " ".join(map(str, p)))]
    result = CliRunner().invoke(cli, ["generate", str(folder), *args, "--beams", "3", "--max-new-tokens", "8",
                                      "--eos-id", "-1"])
    assert result.exit_code == 0, result.output
    assert [list(map(int, line.split())) for line in result.stdout.splitlines()] == beam
    stop = greedy[0][3]  # a token greedy decoding gives the first prompt
    result = CliRunner().invoke(cli, ["generate", str(folder), "--ids", "5 6 7", "--max-new-tokens", "8",
                                      "--eos-id", str(stop)])
    assert result.exit_code == 0, result.output
    assert list(map(int, result.stdout.split())) == greedy[0][: greedy[0].index(stop)]


def test_generate_sampling_flags_reach_the_search(transformer_tiny):
    """`generate --sample --seed --temperature --top-k --top-p` prints what generate() samples
    with those options (each flag changes the rows: none may be lost on the way)."""
    folder = transformer_tiny[1]
    model = rt.load(folder, provider="cpu")
    prompts = [[5, 6, 7], [8, 9], [11, 3, 14, 2]]
    flags = {"seed": 5, "temperature": 3.0, "top_k": 40, "top_p": 0.9}
    want = rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=10, eos_id=-1, do_sample=True, **flags))
    for name in flags:  # each flag, left at its default, gives other rows
        other = {**flags, name: {"seed": 6, "temperature": 1.0, "top_k": 0, "top_p": 1.0}[name]}
        assert rt.generate(model, prompts, rt.SearchOptions(max_new_tokens=10, eos_id=-1, do_sample=True,
                                                            **other)) != want, name
    args = [a for p in prompts for a in ("--ids", " ".join(map(str, p)))]
    args += [a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    result = CliRunner().invoke(cli, ["generate", str(folder), *args, "--sample", "--max-new-tokens", "10",
                                      "--eos-id", "-1"])
    assert result.exit_code == 0, result.output
    assert [list(map(int, line.split())) for line in result.stdout.splitlines()] == want
