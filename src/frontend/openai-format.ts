import type { GenerateBody, Usage } from '../protocol/request-plane.js';
import type { ChatMessageIn, OpenAIRequest } from './openai-schema.js';

export type Endpoint = 'chat' | 'completion';

function messageText(content: ChatMessageIn['content']): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => p.text ?? '').join('');
  return '';
}

/** The worker request for an OpenAI request; the frontend always streams from the worker, so it can retry. */
export function toGenerateBody(endpoint: Endpoint, req: OpenAIRequest, requestId: string): GenerateBody {
  const body: GenerateBody = { model: req.model, stream: true, request_id: requestId };
  if (endpoint === 'chat') body.messages = (req.messages ?? []).map((m) => ({ role: m.role, content: messageText(m.content) }));
  else body.prompt = Array.isArray(req.prompt) ? (req.prompt[0] ?? '') : (req.prompt ?? '');
  const max = req.max_completion_tokens ?? req.max_tokens;
  if (max != null) body.max_tokens = max;
  if (req.temperature != null) body.temperature = req.temperature;
  if (req.top_p != null) body.top_p = req.top_p;
  if (req.response_format != null && req.response_format.type !== 'text') {
    const { type, json_schema: js } = req.response_format;
    // Only the fields the request plane knows: an extra one would be a 400 from the worker.
    body.response_format =
      type === 'json_schema' && js
        ? { type, json_schema: { name: js.name, ...(js.description !== undefined && { description: js.description }), ...(js.schema !== undefined && { schema: js.schema }), ...(js.strict != null && { strict: js.strict }) } }
        : { type: 'json_object' };
  }
  if (req.seed != null) body.seed = req.seed;
  if (req.stop != null) body.stop = req.stop;
  return body;
}

/**
 * Builds SSE events for one streamed response. The per-token event is the hot path: everything but
 * the token text is serialised once, up front.
 */
export class SseFormatter {
  private readonly head: string;
  private readonly object: string;
  readonly created = Math.floor(Date.now() / 1000);

  constructor(
    readonly endpoint: Endpoint,
    readonly id: string,
    readonly model: string,
  ) {
    this.object = endpoint === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    this.head = `data: {"id":${JSON.stringify(id)},"object":"${this.object}","created":${this.created},"model":${JSON.stringify(model)},"choices":[{"index":0,`;
  }

  /** Chat streams open with the assistant role, as OpenAI's do. */
  opening(): string {
    return this.endpoint === 'chat' ? `${this.head}"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n` : '';
  }

  token(text: string): string {
    return this.endpoint === 'chat'
      ? `${this.head}"delta":{"content":${JSON.stringify(text)}},"logprobs":null,"finish_reason":null}]}\n\n`
      : `${this.head}"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":null}]}\n\n`;
  }

  finish(reason: string, usage: Usage | undefined): string {
    const choice = this.endpoint === 'chat' ? `"delta":{},"logprobs":null,"finish_reason":"${reason}"` : `"text":"","logprobs":null,"finish_reason":"${reason}"`;
    let out = `${this.head}${choice}}]}\n\n`;
    if (usage) {
      out += `data: ${JSON.stringify({ id: this.id, object: this.object, created: this.created, model: this.model, choices: [], usage })}\n\n`;
    }
    return out + 'data: [DONE]\n\n';
  }

  error(code: string, message: string): string {
    return `data: ${JSON.stringify({ error: { message, type: 'server_error', param: null, code } })}\n\n`;
  }
}

export function completionResponse(endpoint: Endpoint, id: string, model: string, text: string, finishReason: string, usage: Usage) {
  const created = Math.floor(Date.now() / 1000);
  if (endpoint === 'chat') {
    return {
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [{ index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null, finish_reason: finishReason }],
      usage,
    };
  }
  return { id, object: 'text_completion', created, model, choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason }], usage };
}
