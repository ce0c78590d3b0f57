/** Every error body ebb serves, internal or admin, has this one shape (OpenAI's). */
export interface ErrorBody {
  error: { code: string; message: string; type: string; [extra: string]: unknown };
}

export function errorBody(code: string, message: string, type = 'invalid_request_error', extra: Record<string, unknown> = {}): ErrorBody {
  return { error: { code, message, type, ...extra } };
}

/** An error that knows the HTTP status and code it should be answered with. */
export class HttpError extends Error {
  /** Extra response headers (e.g. WWW-Authenticate on a 401); applied by createHttpServer's error handler. */
  headers?: Record<string, string>;

  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly type = status >= 500 ? 'server_error' : 'invalid_request_error',
  ) {
    super(message);
  }
  body(): ErrorBody {
    return errorBody(this.code, this.message, this.type);
  }
}
