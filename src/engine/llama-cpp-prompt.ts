import { resolveChatWrapper, GeneralChatWrapper, type ChatWrapper, type LlamaModel, type Token } from 'node-llama-cpp';
import type { ChatMessage } from '../protocol/request-plane.js';
import type { ToolCallSyntax, ToolSpec } from '../protocol/tools.js';
import { chatHistoryOf, endsInCall, functionsOf, toolSyntaxOf } from './llama-cpp-tools.js';

/** A request made ready for the model: its tokens, and what ends its answer besides max_tokens. */
export interface RenderedPrompt {
  tokens: Token[];
  /** Tokens that end the answer (the template's end-of-turn markers), beyond the model's own EOG tokens. */
  stopTokens: ReadonlySet<number>;
  /** Text that ends the answer: the caller's stop strings and the template's textual triggers. */
  stopTexts: string[];
}

/**
 * Renders prompts for one model: chat messages through the chat template the GGUF carries (as
 * node-llama-cpp resolves it to a chat wrapper), plain prompts tokenized as they are.
 */
export class PromptRenderer {
  private readonly wrapper: ChatWrapper;
  /** How this model writes a tool call (its chat wrapper's syntax); none: it cannot be declared. */
  readonly toolSyntax: ToolCallSyntax | undefined;

  constructor(private readonly model: LlamaModel) {
    // No template in the file: a generic "role: text" layout, as node-llama-cpp itself falls back to.
    this.wrapper = resolveChatWrapper(model, { warningLogs: false }) ?? new GeneralChatWrapper();
    this.toolSyntax = toolSyntaxOf(this.wrapper);
  }

  get templateName(): string {
    return this.wrapper.wrapperName;
  }

  plain(prompt: string, stops: readonly string[]): RenderedPrompt {
    const text = this.model.tokenize(prompt, false);
    const bos = this.model.tokens.bos;
    const tokens = bos !== null && this.model.tokens.shouldPrependBosToken ? [bos, ...text] : text;
    return { tokens, stopTokens: new Set(), stopTexts: [...stops] };
  }

  /**
   * Text the engine writes into an answer itself (a forced call's parts), its special tokens as
   * such. Text without one is tokenized as text: on the special-token path node-llama-cpp's
   * leading-space trimming leaves SentencePiece's word mark (a space token) in front.
   */
  written(text: string): Token[] {
    const special = this.model.tokenize(text, true, 'trimLeadingSpace');
    return special.some((t) => this.model.isSpecialToken(t)) ? special : this.model.tokenize(text, false, 'trimLeadingSpace');
  }

  /** `tools`: the functions the model may call, documented in the prompt as the wrapper does. */
  chat(messages: readonly ChatMessage[], stops: readonly string[], tools?: readonly ToolSpec[]): RenderedPrompt {
    const history = chatHistoryOf(messages, this.wrapper);
    // An empty model turn at the end: the template renders the opening of the answer. After a
    // call's results the model's response goes on instead.
    const last = history.at(-1);
    if (last === undefined || !endsInCall(last)) history.push({ type: 'model', response: [] });
    const state = this.wrapper.generateContextState({ chatHistory: history, ...(tools !== undefined && tools.length > 0 && { availableFunctions: functionsOf(tools) }) });
    const stopTokens = new Set<number>();
    const stopTexts = [...stops];
    for (const trigger of state.stopGenerationTriggers) {
      const plainText = trigger.values.every((v) => typeof v === 'string');
      const tokens = trigger.tokenize(this.model.tokenizer);
      if (!plainText && tokens.length === 1) stopTokens.add(tokens[0] as number);
      else stopTexts.push(trigger.toString());
    }
    return { tokens: state.contextText.tokenize(this.model.tokenizer), stopTokens, stopTexts: stopTexts.filter((s) => s.length > 0) };
  }
}
