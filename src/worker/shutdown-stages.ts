/** The shutdown's stages and how each ended, as the shutdown reports them and the metrics label them. */
export type StageOutcome = 'completed' | 'timed_out' | 'skipped' | 'cancelled' | 'unsupported';
export type StageName = 'unregister' | 'grace' | 'wait_inflight' | 'handoff' | 'cut_inflight' | 'cleanup';
