package main

// namePrefix is the base of every namespace and directory a run creates
// ("trlbench-<pid of the orchestrator>-...", benchrun.Prefix).
const namePrefix = "trlbench-"
