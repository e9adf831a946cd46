// SillyTavern expands macros in text we hand it: getExtensionPrompt runs substituteParams over
// every injected prompt, and generateRaw over its prompt and system prompt. Memories, summaries
// and transcript lines are the user's words, so a literal "{{char}}" or "<USER>" in them must
// reach the model as written, not as a name, a dice roll or a variable read.
//
// The macro engines match "{{" and the legacy "<USER>", "<BOT>", "<CHAR>", "<GROUP>",
// "<CHARIFNOTGROUP>" tags literally, so a zero-width joiner between the two braces (and after the
// "<" of a legacy tag) stops the match and leaves the text visually unchanged.

const JOINER = '\u2060'; // WORD JOINER: invisible, no line break

const LEGACY_TAGS = /<(USER|BOT|CHAR|GROUP|CHARIFNOTGROUP)>/gi;

/**
 * The text with every macro opener broken, so SillyTavern substitutes nothing in it.
 * @param {string} text
 * @returns {string}
 */
export function neutraliseMacros(text) {
    return String(text ?? '')
        .replace(/\{(?=\{)/g, `{${JOINER}`)
        .replace(LEGACY_TAGS, (_, tag) => `<${JOINER}${tag}>`);
}
