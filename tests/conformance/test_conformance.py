"""One decoder contract in two languages: the Python and JavaScript .pgms decoders agree on every
file of a seeded corpus (``make_corpus.py``): both refuse it, or both decode it to the same
float32 bits. The corpus is generated here (about half a minute); nothing is stored.

The JavaScript half needs Node 20+ and ``web/node_modules`` (``make web-deps``); without them
only the Python half runs, and the JavaScript tests skip saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import make_corpus  # noqa: E402

NODE = shutil.which("node")
HAS_NPM = (ROOT / "web" / "node_modules" / "fzstd").is_dir()
needs_node = pytest.mark.skipif(NODE is None or not HAS_NPM, reason="needs node and web/node_modules (make web-deps)")
MUTANTS = int(os.environ.get("VISIONMOE_CONFORMANCE_MUTANTS", str(make_corpus.MUTANTS)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("conformance")
    return out, make_corpus.build(out, MUTANTS, make_corpus.SEED)


@pytest.fixture(scope="module")
def js(corpus) -> list[dict]:
    if NODE is None or not HAS_NPM:
        pytest.skip("needs node and web/node_modules (make web-deps)")
    out, manifest = corpus
    res = subprocess.run([NODE, str(HERE / "decode_js.mjs"), str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout)["results"]
    assert len(results) == len(manifest["files"])
    return results


def _same(py: dict, js_: dict) -> bool:
    if py["outcome"] != js_["outcome"]:
        return False
    return py["outcome"] != "ok" or (py["count"] == js_["count"] and py["digest"] == js_["digest"])


def test_corpus_holds_every_class(corpus):
    _out, manifest = corpus
    classes = {}
    for e in manifest["files"]:
        classes[e["class"]] = classes.get(e["class"], 0) + 1
    assert classes["mutant"] == MUTANTS and classes["source"] == 6 and classes["case"] >= 12
    assert classes["prefix"] > 1000 and classes["xfrm"] >= 1200
    print(f"corpus: {classes}, generated and decoded by Python in {manifest['seconds']} s")


def test_the_corpus_is_deterministic(corpus):
    """Same seed, same bytes: the first mutants and XFRM edits regenerate identically."""
    out, manifest = corpus
    src = [(out / e["file"]).read_bytes() for e in manifest["files"]
           if e["class"] == "source" and e["what"] != "sh1_copies"]  # the mutants' sources
    again = [d for _w, d in make_corpus.h.mutants(src, 20, make_corpus.SEED)]
    first = [e for e in manifest["files"] if e["class"] == "mutant"][:20]
    assert [(out / e["file"]).read_bytes() for e in first] == again


def test_python_decoder_refuses_only_with_format_error(corpus):
    _out, manifest = corpus
    other = [(e["what"], e["python"]) for e in manifest["files"] if e["python"]["outcome"] not in ("ok", "FormatError")]
    assert not other, other[:5]
    refused = sum(e["python"]["outcome"] == "FormatError" for e in manifest["files"] if e["class"] == "mutant")
    assert refused > MUTANTS // 2  # the mutants reach the checks


def test_python_decoder_meets_the_expected_outcomes(corpus):
    _out, manifest = corpus
    wrong = [(e["what"], e["expect"], e["python"]) for e in manifest["files"] if e["expect"]
             and (e["python"]["outcome"] == "ok") != (e["expect"] == "ok")]
    assert not wrong, wrong


@needs_node
def test_js_decoder_refuses_only_with_format_error(corpus, js):
    _out, manifest = corpus
    other = [(e["what"], r) for e, r in zip(manifest["files"], js) if r["outcome"] not in ("ok", "FormatError")]
    assert not other, other[:5]


@needs_node
def test_js_decoder_meets_the_expected_outcomes(corpus, js):
    _out, manifest = corpus
    wrong = [(e["what"], e["expect"], r) for e, r in zip(manifest["files"], js) if e["expect"]
             and (r["outcome"] == "ok") != (e["expect"] == "ok")]
    assert not wrong, wrong


@needs_node
def test_both_decoders_agree_file_by_file(corpus, js):
    """Same outcome on every file, the same float32 bits wherever both decode. This includes the
    zstd frames whose Huffman literal streams do not end exactly at their last bit: fzstd refuses
    them, and so does the Python decoder (visionmoe.ops.zstd_literals), although the libzstd it
    uses decodes them on 64-bit hosts."""
    _out, manifest = corpus
    differ = [(e["class"], e["what"], e["level"], e["python"], r) for e, r in zip(manifest["files"], js)
              if not _same(e["python"], r)]
    print(f"{len(manifest['files'])} files, the same outcome from both decoders on every one")
    assert not differ, differ[:10]


def test_python_refuses_inexact_huffman_literal_streams(corpus):
    """The mutants whose zstd frames' only flaw is a Huffman literal stream that does not end at
    its last bit (libzstd's fast path decodes them) are refused, saying so."""
    _out, manifest = corpus
    rules = ("does not end exactly at its last bit", "has no end mark")
    refused = [e["what"] for e in manifest["files"] if e["python"]["outcome"] == "FormatError"
               and any(rule in e["python"].get("message", "") for rule in rules)]
    print(f"{len(refused)} files refused for an inexact Huffman literal stream")
    assert len(refused) >= 10, refused
