"""WordPiece tokenizer: BERT's basic tokenization, then greedy longest-match-first sub-words.

Follows BERT (Devlin et al., 2019; Google's ``tokenization.py``) as Hugging Face's
``BertTokenizerFast`` runs it (``tokenizers``' ``BertNormalizer`` + ``BertPreTokenizer`` +
``WordPiece`` model + BERT template), so ids are identical to ``BertTokenizerFast``:

1. **Special tokens** ``[PAD] [UNK] [CLS] [SEP] [MASK]`` written in the text are matched first,
   exactly (case-sensitive, before any normalisation), and become their own ids.
2. **Normalisation** (``BertNormalizer``), in this order: ``clean_text`` removes NUL, U+FFFD and
   control, format and private-use characters (Cc, Cf, Co; not tab, newline, carriage return,
   and not unassigned code points, which ``tokenizers`` keeps) and
   turns whitespace into spaces; ``handle_chinese_chars`` makes every CJK ideograph its own
   word; ``strip_accents`` (default: same as ``lowercase``) decomposes to NFD and drops
   non-spacing marks (category Mn); ``lowercase`` lowers each character on its own (no Greek
   final-sigma rule, as Rust's ``char::to_lowercase``).
3. **Pre-tokenisation** (``BertPreTokenizer``): split on whitespace, and make every punctuation
   character its own word; punctuation is every ASCII character that is neither a letter, a
   digit nor a space (``!"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~``) plus Unicode categories P*.
4. **WordPiece**: per word, take the longest vocabulary entry that starts the word, then the
   longest ``##``-prefixed entry that continues it, and so on; a word with a part that matches
   nothing, or longer than ``max_input_chars_per_word`` (100) characters, becomes one
   ``[UNK]``.

:meth:`WordPieceTokenizer.encode` gives the ids without ``[CLS]``/``[SEP]`` (as
``add_special_tokens=False``); :meth:`~WordPieceTokenizer.encode_for_model` gives model input
``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with token-type ids (0 for A and its
separators, 1 for B and its final ``[SEP]``), an attention mask, and truncation to the model
window (longest-first for pairs, as ``tokenizers``);
:meth:`~WordPieceTokenizer.encode_batch_for_model` pads a batch on the right with ``[PAD]``.

**Training** (:meth:`WordPieceTokenizer.train`) uses the algorithm of Hugging Face
``tokenizers``' ``WordPieceTrainer``: BPE merges over the words of the basic tokenisation, where
every character after the first of a word is a ``##`` continuation symbol; merging ``a`` and
``##b`` gives ``ab``, merging ``##a`` and ``##b`` gives ``##ab``. The vocabulary is the special
tokens, every character of the training words, the ``##`` forms of the characters seen inside
words (each group in code-point order), then the merged symbols in merge order. Ties between
equally frequent pairs go to the pair with the smallest ids (left, then right), the rule of
``tokenizers``' trainer; since our alphabet ids follow code points (``tokenizers`` numbers its
``##`` characters in hash-map order), the result is the same on every machine. (Google's
original trainer scores candidates by the likelihood gain of a unigram language model
instead; we do not implement it.)

Files: :meth:`WordPieceTokenizer.from_vocab_file` reads BERT's ``vocab.txt`` (one token per
line, line number = id); :meth:`~WordPieceTokenizer.from_hf_json` reads a ``tokenizers``
``tokenizer.json`` whose model is ``WordPiece`` (``BertNormalizer`` options, vocab, unk token,
continuing prefix, maximum word length); both are also reached through
:func:`attnlm.tokenizers.load`, which accepts a folder holding either file.
:meth:`~WordPieceTokenizer.save` writes our JSON format (fields in
:meth:`~WordPieceTokenizer.to_dict`).

One job per module:

* :mod:`~attnlm.tokenizers.wordpiece.basic`: steps 1-3 (special tokens, normalisation,
  pre-tokenisation);
* :mod:`~attnlm.tokenizers.wordpiece.tokenizer`: step 4 and decoding
  (:class:`WordPieceTokenizer`, :func:`load_bert_files`);
* :mod:`~attnlm.tokenizers.wordpiece.template`: model input (``[CLS]``/``[SEP]``, token types,
  truncation, padding);
* :mod:`~attnlm.tokenizers.wordpiece.train`: the trainer;
* :mod:`~attnlm.tokenizers.wordpiece.files`: ``vocab.txt``, ``tokenizer.json``,
  ``tokenizer_config.json``.

Every name is importable from ``attnlm.tokenizers.wordpiece`` itself.
"""

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".basic": "CLS MASK MAX_INPUT_CHARS_PER_WORD PAD PREFIX SEP SPECIAL_TOKENS UNK "
        "bert_normalize word_pattern",
        ".files": "config_options hf_json_settings open_bert_file read_vocab_txt write_vocab_txt",
        ".template": "MODEL_INPUT_KEYS model_input pad_rows truncate_longest_first",
        ".tokenizer": "CLEAN_UP WordPieceTokenizer load_bert_files",
        ".train": "learn_vocab",
    },
)
