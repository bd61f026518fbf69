"""Datasets. Deliberately empty of imports so each submodule imports cheaply on its own:

- pope.data.paths             where data live: $POPE_CACHE (sources, prepared data), $POPE_DATA_DIR (names)
- pope.data.prepared          on-disk prepared format (PreparedDataset, TokenSplit, resolve_dataset)
- pope.data.writer            writing it atomically (PreparedWriter, reuse_if_prepared; never deletes foreign files)
- pope.data.registry          dataset names -> builders (used by `pope data prepare`)
- pope.data.vocabulary        whether data fit a model's vocabulary (check_vocab_compatible, check_token_range)
- pope.data.chorales          JSB chorales (canonical JSON or music21's Bach corpus)
- pope.data.maestro           MAESTRO MIDI -> REMI tokens (miditok)
- pope.data.genome            FASTA -> Nucleotide-Transformer 6-mer tokens
- pope.data.text              GPT-2 BPE text: OpenWebText, PG-19, local .txt directories
- pope.data.offline           `pope data offline fetch|status`: real offline sources into $POPE_CACHE
- pope.data.indirect_indexing the synthetic indirect-indexing task

The `pope data prepare|info|offline` commands are pope.cli.data.
"""
