/**
 * How the Kubernetes side fails: a message for the operator, and whether it is a failure or a wait
 * that ran out of time. The CLI picks its exit code from `kind`; k8s/ knows nothing of exit codes.
 */
export class K8sError extends Error {
  constructor(
    message: string,
    readonly kind: 'failed' | 'timed_out' = 'failed',
  ) {
    super(message);
  }
}
