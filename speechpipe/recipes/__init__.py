"""One module per corpus: ``download_<corpus>``, ``prepare_<corpus>`` and pipeline builders."""
