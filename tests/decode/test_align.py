"""Word alignments from an encoder-decoder head: the fast one-layer pass equals the full attention maps,
subword links become word links by SentencePiece's word marks, the chosen head travels in the checkpoint,
and `translate --alignments` writes Pharaoh lines."""

import json

import pytest
import torch
from conftest import tiny_config

import aiayn
from aiayn.checkpoint import list_checkpoints, read_extra
from aiayn.cli import main
from aiayn.data.tokenizer import word_starts
from aiayn.decode.align import candidates, cross_attention, links_of, word_links
from aiayn.decode.translator import Translator
from aiayn.score import read_pharaoh


def test_subword_links_become_word_links_by_the_word_marks():
    src, tgt = ["▁a", "▁dog", "s", "▁runs"], ["▁ein", "▁Hund", "▁läuft"]
    assert word_starts(src) == [0, 1, 1, 2]
    assert word_links({(0, 0), (2, 1), (1, 1), (3, 2)}, src, tgt) == {(0, 0), (1, 1), (2, 2)}


def test_a_heads_links_are_its_argmax_and_a_layers_mean_is_the_mean():
    w = torch.zeros(2, 2, 3, 4)  # layers, heads, target, source
    w[1, 0, :, 2] = 1.0  # head 1 of layer 2 looks at source 2
    w[1, 1, :, 3] = 0.6
    w[1, 1, :, 1] = 0.4
    assert links_of(w, (1, 0)) == {(2, 0), (2, 1), (2, 2)}
    assert links_of(w, (1, None)) == {(2, 0), (2, 1), (2, 2)}  # mean: 0.5 on 2 beats 0.3 on 3
    assert len(candidates(3, 4)) == 15


def test_the_one_layer_pass_equals_the_full_attention_maps(toy_prepared, tmp_path):
    cfg = tiny_config(max_steps=30)
    aiayn.train(cfg, str(toy_prepared), str(tmp_path / "run"))
    t = Translator.load(list_checkpoints(tmp_path / "run")[-1], precision="fp32")
    src = [x[:-1] for x in t.encode_sources((toy_prepared / "test.en.txt").read_text().splitlines()[:20])]
    tgt = [h[0].tokens for h in t.translate_ids([x + [3] for x in src])]
    full = dict(cross_attention(t.model, src, tgt))
    for layer in range(cfg.model.n_dec):
        for k, w in cross_attention(t.model, src, tgt, layer=layer):
            torch.testing.assert_close(w[0], full[k][layer], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_alignments_taken_during_the_search_equal_the_teacher_forced_pass(toy_prepared, tmp_path, beam):
    """The fused step's argmax of the alignment head, followed through the beams' reorderings and
    the finished hypotheses, is the argmax of the same head re-computed over the chosen translation;
    and asking for it changes no translation."""
    cfg = tiny_config(max_steps=30)
    aiayn.train(cfg, str(toy_prepared), str(tmp_path / "run"))
    t = Translator.load(list_checkpoints(tmp_path / "run")[-1], precision="fp32")
    ids = t.encode_sources((toy_prepared / "test.en.txt").read_text().splitlines()[:24])
    plain = t.translate_ids(ids, beam=beam)
    for head in [(cfg.model.n_dec - 1, None), (0, 1)]:
        t.alignment_head = head
        hyps = t.translate_ids(ids, beam=beam, alignments=True)
        assert [[(h.tokens, h.score) for h in hs] for hs in hyps] == [[(h.tokens, h.score) for h in hs] for hs in plain]
        src, tgt = [x[:-1] for x in ids], [h[0].tokens for h in hyps]
        assert all(len(h[0].attended) == len(h[0].tokens) for h in hyps)
        decided = 0
        for k, w in cross_attention(t.model, src, tgt, layer=head[0]):
            teacher = [i for i, _ in sorted(links_of(w, (0, head[1])), key=lambda link: link[1])]
            rows = w[0].mean(0) if head[1] is None else w[0, head[1]]
            for j, (want, got) in enumerate(zip(teacher, hyps[k][0].attended)):
                top2 = rows[j].topk(min(2, rows.shape[-1])).values
                if len(top2) < 2 or top2[0] - top2[1] > 1e-5:  # a clear maximum: the same position
                    assert got == want, (k, j)
                    decided += 1
                else:  # a tie to rounding (the step and the full pass take other kernels): a maximal one
                    assert rows[j, got] >= top2[0] - 1e-5, (k, j)
            assert len(hyps[k][0].attended) == len(teacher)
        assert decided >= 0.9 * sum(len(h[0].tokens) for h in hyps)  # ties are the exception
        assert all(h[0].attended is None for h in t.translate_ids(ids, beam=beam))  # not asked: not kept


def test_align_chooses_a_head_and_translate_writes_its_alignments(toy_prepared, tmp_path, capsys):
    cfg = tiny_config(max_steps=60)
    aiayn.train(cfg, str(toy_prepared), str(tmp_path / "run"))
    ckpt, chosen = list_checkpoints(tmp_path / "run")[-1], tmp_path / "aligned.safetensors"
    assert main(["align", "--checkpoint", str(ckpt), "--data", str(toy_prepared), "--pairs", "40",
                 "-o", str(chosen)]) == 0
    printed = capsys.readouterr().out
    meta = read_extra(chosen)["alignment"]
    n_valid = len((toy_prepared / "valid.en.txt").read_text().splitlines())
    assert 0 <= meta["layer"] < cfg.model.n_dec and meta["pairs"] == min(40, n_valid)
    assert f"AER {meta['aer']:.3f}" in printed
    assert meta["aer"] == min(meta["scores"].values()) or abs(meta["aer"] - min(meta["scores"].values())) < 1e-4
    src = (toy_prepared / "test.en.txt").read_text().splitlines()
    (tmp_path / "in.en").write_text("\n".join(src) + "\n\n")  # a blank line: an empty alignment line
    assert main(["translate", "--checkpoint", str(chosen), "-i", str(tmp_path / "in.en"), "-o", str(tmp_path / "o"),
                 "--alignments", str(tmp_path / "al"), "--precision", "fp32"]) == 0
    lines, outs = (tmp_path / "al").read_text().splitlines(), (tmp_path / "o").read_text().splitlines()
    assert len(lines) == len(outs) == len(src) + 1 and lines[-1] == ""
    for s, o, line in zip(src, outs, lines):
        links = read_pharaoh(line)[0]
        assert bool(links) == bool(o.split()) and all(i < len(s.split()) and j < len(o.split()) for i, j in links)
    assert json.loads(json.dumps(meta))  # the metadata is plain JSON


@pytest.mark.parametrize("bad", [{"layer": 9, "head": 0}, {"layer": 0, "head": 7}, {"head": 0}, "layer 1"])
def test_alignment_metadata_naming_no_head_of_the_model_is_refused(toy_prepared, tmp_path, bad):
    from aiayn.checkpoint import CheckpointError, load_checkpoint, read_weights, save_weights

    aiayn.train(tiny_config(max_steps=2), str(toy_prepared), str(tmp_path / "run"))
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    _, cfg, tok, step = load_checkpoint(ckpt)
    tensors, _ = read_weights(ckpt)
    save_weights(tmp_path / "bad.safetensors", tensors, cfg, tok, step, {"alignment": bad})
    with pytest.raises(CheckpointError, match="bad.safetensors: metadata 'alignment' names no head"):
        Translator.load(tmp_path / "bad.safetensors", precision="fp32")
