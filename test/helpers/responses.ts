import type OpenAI from 'openai';

/**
 * The second turn of the tests' conversation ("tell me about the tides", then "and the moon?") sent
 * whole, as input: what a previous_response_id turn must answer the same as (its history the prefix).
 */
export function secondTurnWhole(client: OpenAI, firstAnswer: string, maxOutputTokens: number) {
  return client.responses.create({
    model: 'm1',
    input: [
      { role: 'user', content: 'tell me about the tides' },
      { role: 'assistant', content: firstAnswer },
      { role: 'user', content: 'and the moon?' },
    ],
    max_output_tokens: maxOutputTokens,
  });
}
