"""`gpn_jax.prepare`'s library: a text corpus -> SentencePiece token shards for `bin:` training.

* `inputs`: files / directories / globs of .txt, .jsonl(.gz|.zst), .parquet, or tfds, read as
  raw record chunks from a resumable position;
* `encode`: the tokenizing worker (JSON parsing, SentencePiece, eos after each document);
* `parallel`: an ordered map over worker processes with bounded read-ahead;
* `heldout`: the deterministic whole-document held-out choice;
* `tokenizer_step`: the given tokenizer, or one trained on a sample of training documents;
* `shards`: fixed-size shards written atomically and resumably;
* `manifest`: the manifest / progress files and `read_prepared` for `bin:` training;
* `run`: `prepare_corpus`, which ties them together.
"""
