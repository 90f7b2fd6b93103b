"""cachecheck measures on the cache-path probe's own prompts (the built-in suite shared_prefix)."""

from kvqual.serve.cachecheck import shared_document_prompts
from kvqual.suites.generated import generate


class WordTokenizer:
    """A stand-in for the model's tokenizer: a chat template and one id per word, stable per word."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<|{m['role']}|> {m['content']} <|end|> " for m in messages) + "<|assistant|>"

    def __call__(self, text, add_special_tokens):
        assert add_special_tokens is False
        ids = [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]
        return type("Encoded", (), {"input_ids": ids})()


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_prompts_are_the_probe_suites_first_documents_in_two_waves() -> None:
    prompts = shared_document_prompts(WordTokenizer(), docs=3)
    items = generate("shared_prefix", limit=12)
    assert [p.answer for p in prompts] == [i.answer for i in items]
    assert [p.doc for p in prompts] == [i.context_id for i in items]
    assert [p.wave for p in prompts] == [0, 1, 1, 1] * 3
    assert len({p.doc for p in prompts}) == 3
    for d in range(3):
        group = prompts[4 * d: 4 * d + 4]
        first = group[0].ids
        for later in group[1:]:
            shared = _common_prefix(first, later.ids)
            assert shared < len(later.ids)  # the questions differ
            assert shared / len(later.ids) > 0.9, "a document's prompts must share all but the question"
    assert _common_prefix(prompts[0].ids, prompts[4].ids) < 0.1 * len(prompts[4].ids)
