"""
HARNESS package: everything agent.py's loop uses, one module per concern. agent.py holds only the loop and its
rules; report.py reads the ledger through the same module agent.py writes it with.

    errors     SetupError / Stop: how a problem reaches the user
    target     what a target is: its frozen constants, the budget, prepare.py --check / --preflight
    prompts    every word the LLM reads, and the history table
    edits      DESCRIPTION + SEARCH/REPLACE answers -> a new train.py (the one path every proposer's answer takes)
    proposers  who proposes: the LLM providers (retries, prices) and the random/grid perturbations, one signature
    perturb    the random/grid perturbations of train.py's UPPER_CASE constants
    gitops     git: the branch, candidate commits and refs, reset to the best commit, the repository lock
    ledger     results.tsv and events.jsonl: the formats, writing, reading, resume facts
    runner     run one commit's train.py with a timeout in its own process group, evaluate it separately -> Outcome
    sandbox    the bubblewrap command line train.py runs in (read-only filesystem, hidden paths, no network)
    guard      what a run may not change outside its run dir: checked around every run, the harness's own restored
    redact     secrets: which environment variables never reach train.py, and their values out of every record
    console    the live status line and printed lines
    session    the state of one tag, rebuilt from git and the ledger on every start (setup and resume)

No module here imports agent.py, prepare.py or train.py.
"""
