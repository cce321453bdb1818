"""Model families: what each architecture changes in the one decoder (see base.Family)."""
