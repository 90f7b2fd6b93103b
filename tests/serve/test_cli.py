"""`kvqual serve` flags that are refused before any model is loaded."""

import pytest

from kvqual.serve.cli import main


@pytest.mark.parametrize("dtype", ["bf16", "auto"])
def test_kv_fault_without_fp8_is_refused_in_one_line(dtype, capsys):
    assert main(["--kv-cache-dtype", dtype, "--kv-fault", "ignore-scale-on-read"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kvqual serve: --kv-fault ignore-scale-on-read needs an fp8 KV cache")
    assert "not bf16" in err


def test_unknown_kv_fault_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--kv-cache-dtype", "fp8_e4m3", "--kv-fault", "flip-bits"])
    assert exc.value.code == 2
    assert "ignore-scale-on-read" in capsys.readouterr().err  # argparse lists the choices


def test_unknown_kv_cache_dtype_is_one_line_exit_2(capsys):
    from kvqual.cli import main as kvqual_main

    for entry in (lambda: kvqual_main(["serve", "--kv-cache-dtype", "fp3"]),  # kvqual serve ...
                  lambda: main(["--kv-cache-dtype", "fp3"])):  # python -m kvqual.serve ...
        with pytest.raises(SystemExit) as exc:
            entry()
        assert exc.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1  # one line, no usage block
        assert captured.err.startswith("kvqual serve: error: argument --kv-cache-dtype: invalid choice: 'fp3'")
        assert captured.err.endswith(" (see kvqual serve --help)\n")
        assert all(d in captured.err for d in ("auto", "bf16", "fp8_e4m3", "fp8_e5m2"))  # the choices, named


def test_without_the_serve_extra_it_names_the_extra_in_one_line(capsys, monkeypatch):
    """`pip install kvqual` without [serve], then `kvqual serve`: one line naming the extra, exit 2 —
    not a traceback of `import torch` (a None entry in sys.modules is how Python spells "absent")."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert main(["--kv-cache-dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kvqual serve: needs the [serve] extra, and torch, gguf are not installed: "
                          "pip install 'kvqual[serve]'")
