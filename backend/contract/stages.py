"""The host's stage names that programs other than the stage itself read (their run directories'
`stage`): one definition, so a stage never imports another stage for its name."""

FETCH_DRAFTER = "fetch_drafter"
