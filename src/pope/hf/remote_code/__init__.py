"""The two files pope.hf's ``save_pretrained`` copies beside config.json (see pope.hf.remote)."""
