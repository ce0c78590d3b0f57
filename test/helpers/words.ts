/** `n` distinct words tagged `tag` (tag0 tag1 ...): a prompt whose blocks no other tag's share. */
export const words = (n: number, tag: string) => Array.from({ length: n }, (_, i) => `${tag}${i}`).join(' ');
