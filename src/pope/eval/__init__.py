"""Evaluation tools (issue 6).

Sub-modules, each imported on demand so ``import pope`` stays light:

- :mod:`pope.eval.windows`      how a token split is cut into scoring windows (every token scored once)
- :mod:`pope.eval.length`       perplexity versus evaluation length: scoring a split at each length
- :mod:`pope.eval.length_runs`  ``pope eval length`` over runs: their models, result files and plots
- :mod:`pope.eval.frequency_usage`  per layer x frequency query/key magnitudes, learned delta
                                  (``pope analyze frequencies``)
- :mod:`pope.eval.lm_eval_model`    lm-evaluation-harness model ``pope`` (``pope eval downstream``)
- :mod:`pope.eval.report`       markdown tables over runs and seeds (``pope report``)
- :mod:`pope.eval.demo`         the CPU demo behind ``make demo``

The commands above are registered by :mod:`pope.cli.eval`.
"""
