"""Data pipeline: text / tfds / pre-tokenised sources -> tokenizer -> resumable windows (Grain)."""

from gpn_jax.data.bin_source import ShardedTokens, open_bin
from gpn_jax.data.pipeline import Data, DataConfig, build, build_data, from_config, loss_mask
from gpn_jax.data.spec import SourceSpec, parse_spec
from gpn_jax.data.split import split_documents, split_tokens
from gpn_jax.data.stream import tokenize_documents, unigram_counts
from gpn_jax.data.text_sources import embedded_corpus, iter_jsonl_file, iter_path_documents
from gpn_jax.data.tfds_source import iter_tfds_documents
from gpn_jax.data.tokenizer import Tokenizer, check_vocab, load_tokenizer, train_tokenizer
from gpn_jax.data.windows import WindowIterator, WindowSource

__all__ = [
    "Data",
    "DataConfig",
    "ShardedTokens",
    "SourceSpec",
    "Tokenizer",
    "WindowIterator",
    "WindowSource",
    "build",
    "build_data",
    "check_vocab",
    "embedded_corpus",
    "from_config",
    "iter_jsonl_file",
    "iter_path_documents",
    "iter_tfds_documents",
    "load_tokenizer",
    "loss_mask",
    "open_bin",
    "parse_spec",
    "split_documents",
    "split_tokens",
    "tokenize_documents",
    "train_tokenizer",
    "unigram_counts",
]
