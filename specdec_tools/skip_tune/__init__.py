"""`specdec tune-skip`: a Bayesian search of a layer-skip draft's skip set.

Draft & Verify (Zhang et al. 2023) chooses which decoder layers a self-speculative draft
skips with Bayesian optimisation; this package does the same with optuna's TPE over a
cost model of the whole speculative system:

* `calibration`: the target's own greedy text on calibration prompts, the text a draft
  has to predict;
* `agreement`: per position, whether the model minus a skip set predicts that text's
  next token (teacher-forced, one forward pass per sequence);
* `cost`: the rounds a greedy speculative loop would run over that text, and their
  time from measured step costs (`timing`), as a predicted speedup over target-only;
* `study`: the optuna study (SQLite under $SPECDEC_HOME, resumable), pruning, and the
  comparison with random sets of the same size; `cli`: the command.
"""
