/*
 * The newer chats' incoming webhooks as their vendors document them, for the tests' receivers: what each checks in
 * a message (required fields, types, button counts, text lengths, sizes, the markup its texts may hold) and how it
 * answers, a message it would take and one it would refuse. Each check returns the problems it finds (none: the
 * vendor would take it).
 *
 *   teams       Workflows webhook + Adaptive Card  learn.microsoft.com …/add-incoming-webhook, adaptivecards.io/explorer
 *   discord     Execute Webhook                    discord.com/developers/docs/resources/webhook#execute-webhook
 *   googlechat  incoming webhook, cardsV2          developers.google.com/workspace/chat/api/reference/rest/v1/cards
 *   telegram    Bot API sendMessage                core.telegram.org/bots/api#sendmessage
 *   lark        custom bot (Feishu's format)       open.larksuite.com/document/client-docs/bot-v3/add-custom-bot
 */
import { createHmac } from 'node:crypto';
import type { Answer, Received } from './receiver.ts';

export const NEW_FORMATS = ['teams', 'discord', 'googlechat', 'telegram', 'lark'] as const;
export type NewFormat = (typeof NEW_FORMATS)[number];

/** A button a message carries: its label and the URL it opens. */
export interface Button {
  label: string;
  url: string;
}

interface ChatShape {
  /** The path its webhook URL has (after the host): a test posts there, after a prefix of its own. */
  path: string;
  /** What in a path says it is this format's. */
  marker: string;
  /** What is wrong with a message, as the vendor would refuse it (empty: taken). */
  problems(body: any, request: Received, secret?: string): string[];
  /** The vendor's answer to a message it took. */
  ok: Answer;
  /** The buttons (Discord: the Markdown links) the message carries, in order. */
  buttons(body: any): Button[];
  /** Every text in the message that may hold a request's text, with the markup the chat would render in it. */
  texts(body: any): string[];
}

const bytes = (body: unknown) => Buffer.byteLength(JSON.stringify(body));
const isUrl = (u: unknown) => typeof u === 'string' && /^https?:\/\/[^\s]+$/.test(u) && URL.canParse(u);
const str = (v: unknown) => typeof v === 'string';

/** Teams: 28 KB a message; a Workflows post answers 202 with no body. */
const TEAMS_MAX_BYTES = 28 * 1024;
/** Discord's embed limits. */
const DISCORD = { content: 2000, embeds: 10, title: 256, description: 4096, fields: 25, fieldName: 256, fieldValue: 1024, total: 6000 };
/** Google Chat: 32,000 bytes a message, 100 widgets a card. */
const GOOGLE_CHAT = { bytes: 32_000, widgets: 100 };
/** Telegram: a message's text is 1-4096 characters after entities parsing; the tags HTML parse mode takes. */
const TELEGRAM = { text: 4096, tags: ['b', 'strong', 'i', 'em', 'u', 'ins', 's', 'strike', 'del', 'code', 'pre', 'a', 'tg-spoiler', 'blockquote'] };
/** Lark/Feishu: a custom bot's request body at most 20 KB. */
const LARK_MAX_BYTES = 20 * 1024;

function teamsProblems(body: any): string[] {
  const p: string[] = [];
  if (body?.type !== 'message') p.push('type is not "message"');
  const a = body?.attachments?.[0];
  if (a?.contentType !== 'application/vnd.microsoft.card.adaptive') p.push('attachments[0].contentType is not an Adaptive Card');
  const card = a?.content;
  if (card?.type !== 'AdaptiveCard' || !str(card?.version) || !Array.isArray(card?.body)) p.push('content is not an AdaptiveCard with version and body');
  for (const [i, e] of (card?.body ?? []).entries()) {
    if (e.type === 'TextBlock' && !str(e.text)) p.push(`body[${i}].text is not a string`);
    else if (e.type === 'FactSet' && !(Array.isArray(e.facts) && e.facts.every((f: any) => str(f.title) && str(f.value)))) p.push(`body[${i}].facts are not title/value strings`);
    else if (e.type !== 'TextBlock' && e.type !== 'FactSet') p.push(`body[${i}].type ${e.type} is not expected`);
  }
  for (const [i, x] of (card?.actions ?? []).entries())
    if (x.type !== 'Action.OpenUrl' || !str(x.title) || !isUrl(x.url) || (x.style !== undefined && !['default', 'positive', 'destructive'].includes(x.style)))
      p.push(`actions[${i}] is not an Action.OpenUrl with a title and a URL`);
  // Teams shows at most 6 actions (its host config's maxActions).
  if ((card?.actions ?? []).length > 6) p.push('more than 6 actions');
  if (bytes(body) > TEAMS_MAX_BYTES) p.push(`${bytes(body)} bytes, more than 28 KB`);
  return p;
}

function discordProblems(body: any): string[] {
  const p: string[] = [];
  if (body?.content === undefined && !body?.embeds?.length) p.push('neither content nor embeds');
  if (str(body?.content) && body.content.length > DISCORD.content) p.push('content over 2000 characters');
  if (!Array.isArray(body?.allowed_mentions?.parse)) p.push('allowed_mentions.parse is not a list');
  if (body?.components !== undefined) p.push('components: a webhook no application owns cannot send them');
  if ((body?.embeds ?? []).length > DISCORD.embeds) p.push('more than 10 embeds');
  let total = 0;
  for (const [i, e] of (body?.embeds ?? []).entries()) {
    const at = `embeds[${i}]`;
    if (str(e.title) && e.title.length > DISCORD.title) p.push(`${at}.title over 256 characters`);
    if (str(e.description) && e.description.length > DISCORD.description) p.push(`${at}.description over 4096 characters`);
    if (e.color !== undefined && !(Number.isInteger(e.color) && e.color >= 0 && e.color <= 0xffffff)) p.push(`${at}.color is not an RGB integer`);
    if ((e.fields ?? []).length > DISCORD.fields) p.push(`${at} has more than 25 fields`);
    for (const [j, f] of (e.fields ?? []).entries()) {
      if (!str(f.name) || f.name.length < 1 || f.name.length > DISCORD.fieldName) p.push(`${at}.fields[${j}].name is not 1-256 characters`);
      if (!str(f.value) || f.value.length < 1 || f.value.length > DISCORD.fieldValue) p.push(`${at}.fields[${j}].value is not 1-1024 characters`);
      total += (f.name?.length ?? 0) + (f.value?.length ?? 0);
    }
    total += (e.title?.length ?? 0) + (e.description?.length ?? 0) + (e.footer?.text?.length ?? 0) + (e.author?.name?.length ?? 0);
    if (e.timestamp !== undefined && Number.isNaN(Date.parse(e.timestamp))) p.push(`${at}.timestamp is not ISO 8601`);
  }
  if (total > DISCORD.total) p.push(`the embeds hold ${total} characters, more than 6000`);
  return p;
}

function googleChatProblems(body: any): string[] {
  const p: string[] = [];
  const cards = body?.cardsV2;
  if (!Array.isArray(cards) || cards.length === 0) p.push('no cardsV2');
  for (const [i, c] of (cards ?? []).entries()) {
    if (cards.length > 1 && !str(c.cardId)) p.push(`cardsV2[${i}].cardId is required with several cards`);
    if (c.card?.header !== undefined && !str(c.card.header.title)) p.push(`cardsV2[${i}].card.header.title is required`);
    const widgets = (c.card?.sections ?? []).flatMap((s: any) => s.widgets ?? []);
    if (widgets.length > GOOGLE_CHAT.widgets) p.push(`cardsV2[${i}] has more than 100 widgets`);
    for (const w of widgets) {
      const kinds = Object.keys(w);
      if (kinds.length !== 1) p.push(`a widget is ${kinds.join(' and ')}: one kind each`);
      if (w.decoratedText && !str(w.decoratedText.text)) p.push('decoratedText.text is required');
      if (w.textParagraph && !str(w.textParagraph.text)) p.push('textParagraph.text is required');
      for (const b of w.buttonList?.buttons ?? [])
        if (!str(b.text) || !isUrl(b.onClick?.openLink?.url)) p.push('a button has no text or no onClick.openLink.url');
    }
  }
  if (bytes(body) > GOOGLE_CHAT.bytes) p.push(`${bytes(body)} bytes, more than 32,000`);
  return p;
}

/** Telegram's HTML: the tags it takes, balanced, no bare < or &; the text as shown (tags out, entities decoded). */
export function telegramShown(html: string): { shown: string; problems: string[] } {
  const problems: string[] = [];
  const open: string[] = [];
  for (const m of html.matchAll(/<(\/?)([a-z-]+)[^>]*>/g)) {
    if (!TELEGRAM.tags.includes(m[2])) problems.push(`<${m[2]}> is not a tag Telegram takes`);
    if (m[1] === '') open.push(m[2]);
    else if (open.pop() !== m[2]) problems.push(`</${m[2]}> closes what it did not open`);
  }
  if (open.length) problems.push(`<${open.join('>, <')}> not closed`);
  const text = html.replace(/<\/?[a-z-]+[^>]*>/g, '');
  if (/<|>|&(?!(?:lt|gt|amp|quot|#\d+);)/.test(text)) problems.push('a bare <, > or & (not an entity)');
  const shown = text.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&#(\d+);/g, (_, n) => String.fromCodePoint(Number(n))).replace(/&amp;/g, '&');
  return { shown, problems };
}

function telegramProblems(body: any, r: Received): string[] {
  const p: string[] = [];
  if (!/\/bot\d+:[\w-]+\/sendMessage$/i.test(new URL(r.url, 'https://x').pathname)) p.push('not a /bot<token>/sendMessage URL');
  if (!(str(body?.chat_id) || Number.isInteger(body?.chat_id))) p.push('chat_id is required');
  if (!str(body?.text)) return [...p, 'text is required'];
  if (body.parse_mode !== 'HTML') p.push('parse_mode is not HTML');
  const { shown, problems } = telegramShown(body.text);
  p.push(...problems);
  if (shown.length < 1 || shown.length > TELEGRAM.text) p.push(`the text is ${shown.length} characters after parsing, not 1-4096`);
  const rows = body.reply_markup?.inline_keyboard;
  if (body.reply_markup !== undefined && !Array.isArray(rows)) p.push('reply_markup.inline_keyboard is not a list of rows');
  for (const b of (rows ?? []).flat())
    if (!str(b.text) || b.text === '' || !isUrl(b.url)) p.push('an inline keyboard button has no text or no http(s) url');
  return p;
}

function larkProblems(body: any, _r: Received, secret?: string): string[] {
  const p: string[] = [];
  if (body?.msg_type !== 'interactive') p.push('msg_type is not interactive');
  const card = body?.card;
  if (card?.header?.title?.tag !== 'plain_text' || !str(card?.header?.title?.content)) p.push('card.header.title is not plain_text');
  for (const e of card?.elements ?? []) {
    if (e.tag === 'markdown' && !str(e.content)) p.push('a markdown element has no content');
    if (e.tag === 'action')
      for (const b of e.actions ?? [])
        if (b.tag !== 'button' || b.text?.tag !== 'plain_text' || !isUrl(b.url) || !['default', 'primary', 'danger'].includes(b.type)) p.push('an action is not a URL button');
  }
  if (secret !== undefined) {
    const sign = createHmac('sha256', `${body?.timestamp}\n${secret}`).update('').digest('base64');
    if (!/^\d{10}$/.test(body?.timestamp ?? '') || body?.sign !== sign) p.push('sign match fail or timestamp is not within one hour from current time');
  }
  if (bytes(body) > LARK_MAX_BYTES) p.push(`${bytes(body)} bytes, more than 20 KB`);
  return p;
}

export const CHAT_SHAPES: Record<NewFormat, ChatShape> = {
  teams: {
    marker: '/workflows/',
    path: '/workflows/7f3c/triggers/manual/paths/invoke?api-version=1&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig=teams-sig-5c1f',
    problems: teamsProblems,
    ok: { status: 202, body: '' },
    buttons: (b) => (b.attachments[0].content.actions ?? []).map((a: any) => ({ label: a.title, url: a.url })),
    texts: (b) => b.attachments[0].content.body.flatMap((e: any) => (e.type === 'FactSet' ? e.facts.map((f: any) => f.value) : [e.text])),
  },
  discord: {
    marker: '/api/webhooks/',
    path: '/api/webhooks/1234567890/discord-token-9b2e',
    problems: discordProblems,
    ok: { status: 204, body: '' },
    buttons: (b) => [...(b.embeds[0].description ?? '').matchAll(/\[([^\]]+)\]\(([^)]+)\)/g)].map((m) => ({ label: m[1], url: m[2] })),
    texts: (b) => [b.embeds[0].title, ...b.embeds[0].fields.map((f: any) => f.value)],
  },
  googlechat: {
    marker: '/v1/spaces/',
    path: '/v1/spaces/AAAA/messages?key=gchat-key-31d7&token=gchat-token-e04a',
    problems: googleChatProblems,
    ok: { status: 200, body: '{"name":"spaces/AAAA/messages/x"}' },
    buttons: (b) =>
      b.cardsV2[0].card.sections.flatMap((s: any) => s.widgets).flatMap((w: any) => w.buttonList?.buttons ?? [])
        .map((x: any) => ({ label: x.text, url: x.onClick.openLink.url })),
    texts: (b) => [b.cardsV2[0].card.header.title, ...b.cardsV2[0].card.sections.flatMap((s: any) => s.widgets).flatMap((w: any) => (w.decoratedText ? [w.decoratedText.text] : []))],
  },
  telegram: {
    marker: '/sendMessage',
    path: '/bot4839574812:AAFq-telegram-token_x9/sendMessage',
    problems: telegramProblems,
    ok: { status: 200, body: '{"ok":true,"result":{"message_id":7,"chat":{"id":-1001234567890,"type":"supergroup"},"date":0}}' },
    buttons: (b) => (b.reply_markup?.inline_keyboard ?? []).flat().map((x: any) => ({ label: x.text, url: x.url })),
    texts: (b) => [b.text],
  },
  lark: {
    marker: '/open-apis/bot/v2/hook/',
    path: '/open-apis/bot/v2/hook/lark-hook-6a0e',
    problems: larkProblems,
    ok: { status: 200, body: '{"code":0,"msg":"success","data":{}}' },
    buttons: (b) => (b.card.elements.find((e: any) => e.tag === 'action')?.actions ?? []).map((x: any) => ({ label: x.text.content, url: x.url })),
    texts: (b) => [b.card.header.title.content, ...b.card.elements.filter((e: any) => e.tag === 'markdown').map((e: any) => e.content)],
  },
};

/** The format a request to a receiver is for, by its path. */
export function formatOf(r: Received): NewFormat | undefined {
  const pathname = new URL(r.url, 'https://x').pathname;
  return NEW_FORMATS.find((f) => pathname.includes(CHAT_SHAPES[f].marker));
}

/**
 * How a vendor answers a request: what it takes, as it documents its success; what it would refuse, with 400 and
 * the problems (Telegram in its own shape). `secrets` are Lark's signing secrets by path.
 */
export function vendorAnswer(r: Received, secrets: Record<string, string> = {}): Answer | undefined {
  const format = formatOf(r);
  if (!format) return undefined;
  let body: unknown;
  try {
    body = JSON.parse(r.body);
  } catch {
    return { status: 400, body: '{"message":"not JSON"}' };
  }
  const problems = CHAT_SHAPES[format].problems(body, r, secrets[new URL(r.url, 'https://x').pathname]);
  if (problems.length === 0) return CHAT_SHAPES[format].ok;
  const description = `Bad Request: ${problems.join('; ')}`;
  return { status: 400, body: JSON.stringify(format === 'telegram' ? { ok: false, error_code: 400, description } : { message: description }) };
}
