export { resumableFetch, defaultBackoffMs, type ResumableFetchOptions } from './resumable-fetch.js';
export { RESUMABLE_HEADER } from './ebb-streams.js';
export { StreamCutError, type CutCause, type ResumeEvent } from './resumable-body.js';
