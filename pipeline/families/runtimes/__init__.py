"""The runtimes a served model's encoder can run on besides torch, and the choice among them: not a family.

Any family whose encoder can be handed over (`DecisionFamily.served_encoder`) runs on them; they import the
family interface (`pipeline.families.base`), never a family's own modules, so both families sit above them.
"""
