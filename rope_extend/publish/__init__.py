"""Publishing an output folder to the Hugging Face Hub (`rope-extend push`, `patch`/`train --push-to-hub`).

One concern per module, in the order a push runs: `selection` (what may be sent, from OUT's record: no network,
nothing written), `cards` (the cards a push sends from memory: the Serving section renamed for the repo, an
unverified folder's note, a GGUF's card), `plan` (`PushPlan`: the selection, the cards and the commit, computed once;
what the dry run prints; the token), `upload` (the transfer: LFS objects, then one commit, under one retry policy)
and `push` (the plan executed, every failure one line). A push never writes OUT.
"""
