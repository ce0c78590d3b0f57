import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';

/**
 * A response with no client behind it, for a generation that runs on its own (a background
 * response): the relay writes its head and end here as to any response; its body goes only to the
 * kept stream (ClientStream writes nothing without a socket), and the few bytes of head and end
 * are held until it is collected.
 */
export function detachedResponse(): ServerResponse {
  return new ServerResponse(new IncomingMessage(new Socket()));
}
