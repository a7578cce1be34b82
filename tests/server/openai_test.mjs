// strata serve, driven by the official `openai` npm client.
// Env: STRATA_URL (a server with --api-key $STRATA_KEY on a random tiny
// model), STRATA_DEBUG_URL (a server started with --debug-reply holding a
// <tool_call> block: the tool-call round trip through parsing and response
// building; a random model never writes a call), STRATA_MODEL_ID.
// Prints "PASS name" / "FAIL name: why" per check; test_server.sh counts them.
import OpenAI from 'openai';

const url = process.env.STRATA_URL, dbgUrl = process.env.STRATA_DEBUG_URL, key = process.env.STRATA_KEY;
const modelId = process.env.STRATA_MODEL_ID;
const client = new OpenAI({ baseURL: url + '/v1', apiKey: key, maxRetries: 0, timeout: 30000 });
const dbg = new OpenAI({ baseURL: dbgUrl + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 30000 });

let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`PASS ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${(e && e.stack) || e}`.split('\n').slice(0, 4).join(' | '));
  }
}
function assert(cond, msg) { if (!cond) throw new Error(msg); }
function eq(a, b, msg) { if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${msg}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`); }
async function status(p) {
  try { await p; } catch (e) { return e.status; }
  return 200;
}

const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name a colour.' }];
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

await check('models.list', async () => {
  const list = await client.models.list();
  const ids = list.data.map(m => m.id);
  eq(ids, [modelId], 'model ids');
});

let greedy = null;
await check('chat non-streaming (greedy)', async () => {
  const r = await client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 12, temperature: 0 });
  const c = r.choices[0];
  eq(c.message.role, 'assistant', 'role');
  assert(typeof c.message.content === 'string' && c.message.content.length > 0, 'content is a non-empty string');
  assert(['length', 'stop'].includes(c.finish_reason), 'finish_reason ' + c.finish_reason);
  assert(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 12, 'completion_tokens ' + r.usage.completion_tokens);
  eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, 'total_tokens');
  eq(r.object, 'chat.completion', 'object');
  greedy = c.message.content;
});

await check('chat streaming equals non-streaming (greedy)', async () => {
  const stream = await client.chat.completions.create({
    model: modelId, messages: msgs, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null, n = 0, role = null;
  for await (const ch of stream) {
    n++;
    eq(ch.object, 'chat.completion.chunk', 'chunk object');
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert(n >= 3, 'chunks ' + n);
  eq(role, 'assistant', 'role');
  eq(text, greedy, 'streamed text');
  assert(['length', 'stop'].includes(finish), 'finish ' + finish);
  assert(usage && usage.completion_tokens > 0, 'usage chunk');
});

await check('seeded sampling is reproducible', async () => {
  const req = { model: modelId, messages: msgs, max_tokens: 10, temperature: 0.9, top_p: 0.9, seed: 1234 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  eq(a.choices[0].message.content, b.choices[0].message.content, 'same seed, same text');
});

let ctext = null;
await check('completions (greedy) and streaming completions agree', async () => {
  const r = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
  eq(r.object, 'text_completion', 'object');
  ctext = r.choices[0].text;
  assert(typeof ctext === 'string' && ctext.length > 0, 'text');
  eq(r.choices[0].finish_reason, 'length', 'finish_reason');
  eq(r.usage.completion_tokens, 16, 'completion_tokens');
  const s = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 16, temperature: 0, stream: true });
  let t = '';
  for await (const ch of s) t += ch.choices.map(c => c.text).join('');
  eq(t, ctext, 'streamed completion');
});

await check('stop string ends the completion', async () => {
  // a stop string taken from the greedy text: the reply must end right before it
  const chars = [...ctext];
  let i = chars.findIndex((c, k) => k >= 2 && /[A-Za-z0-9]/.test(c));
  assert(i >= 0, 'no ASCII character to stop at in ' + JSON.stringify(ctext));
  const stop = chars[i];
  const expect = ctext.slice(0, ctext.indexOf(stop));
  const r = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 16, temperature: 0, stop: [stop] });
  eq(r.choices[0].text, expect, 'text before the stop string');
  eq(r.choices[0].finish_reason, 'stop', 'finish_reason');
  const s = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 16, temperature: 0, stop: stop, stream: true });
  let t = '';
  for await (const ch of s) t += ch.choices.map(c => c.text).join('');
  eq(t, expect, 'streamed text before the stop string');
});

await check('tools with a random model (seeded): parsed, no call', async () => {
  const r = await client.chat.completions.create({ model: modelId, messages: msgs, tools, max_tokens: 16, temperature: 0.8, seed: 7 });
  const c = r.choices[0];
  // the random model writes no <tool_call>: the parse path runs and returns the text
  assert(['length', 'stop', 'tool_calls'].includes(c.finish_reason), 'finish ' + c.finish_reason);
  if (c.finish_reason !== 'tool_calls') assert(typeof c.message.content === 'string', 'content');
  // the tool definitions reach the prompt
  const plain = await client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 1, temperature: 0 });
  assert(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20, 'tools block in the prompt');
  const none = await client.chat.completions.create({ model: modelId, messages: msgs, tools, tool_choice: 'none', max_tokens: 1, temperature: 0 });
  eq(none.usage.prompt_tokens, plain.usage.prompt_tokens, 'tool_choice none leaves tools out');
});

await check('tool-call round trip (--debug-reply server)', async () => {
  const first = await dbg.chat.completions.create({
    model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice: 'auto',
  });
  const c = first.choices[0];
  eq(c.finish_reason, 'tool_calls', 'finish_reason');
  eq(c.message.content, null, 'content');
  eq(c.message.tool_calls.length, 1, 'one call');
  const call = c.message.tool_calls[0];
  eq(call.type, 'function', 'type');
  eq(call.function.name, 'get_weather', 'name');
  eq(JSON.parse(call.function.arguments), { city: 'Paris' }, 'arguments');
  assert(typeof call.id === 'string' && call.id.length > 0, 'id');
  // send the call and its result back
  const second = await dbg.chat.completions.create({
    model: 'x', tools,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      c.message,
      { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' },
    ],
  });
  assert(second.usage.prompt_tokens > first.usage.prompt_tokens + 10, 'the call and its result are in the prompt');
  eq(second.usage.prompt_tokens_details.cached_tokens > 0, true, 'prefix reused from the KV cache');
});

await check('tool call streamed (--debug-reply server)', async () => {
  const s = await dbg.chat.completions.create({
    model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, stream: true,
  });
  let calls = [], finish = null;
  for await (const ch of s) for (const c of ch.choices) {
    if (c.delta.tool_calls) calls.push(...c.delta.tool_calls);
    if (c.finish_reason) finish = c.finish_reason;
  }
  eq(finish, 'tool_calls', 'finish_reason');
  eq(calls.length, 1, 'one call');
  eq(calls[0].function.name, 'get_weather', 'name');
  eq(JSON.parse(calls[0].function.arguments), { city: 'Paris' }, 'arguments');
});

await check('without tools the reply is plain text (--debug-reply server)', async () => {
  const r = await dbg.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }] });
  assert(r.choices[0].message.content.includes('<tool_call>'), 'raw text');
  assert(!r.choices[0].message.tool_calls, 'no tool_calls');
  eq(r.choices[0].finish_reason, 'stop', 'finish_reason');
});

await check('errors: 401 bad key', async () => {
  const bad = new OpenAI({ baseURL: url + '/v1', apiKey: 'wrong', maxRetries: 0 });
  eq(await status(bad.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 1 })), 401, 'status');
  eq(await status(bad.models.list()), 401, 'models status');
});

await check('errors: 400 wrong types', async () => {
  eq(await status(client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 'many' })), 400, 'max_tokens string');
  eq(await status(client.chat.completions.create({ model: modelId, messages: 'hello' })), 400, 'messages string');
  eq(await status(client.chat.completions.create({ model: modelId, messages: [{ role: 'wizard', content: 'x' }] })), 400, 'bad role');
  eq(await status(client.chat.completions.create({ model: modelId, messages: msgs, temperature: 'hot' })), 400, 'temperature');
  eq(await status(client.completions.create({ model: modelId, prompt: 42 })), 400, 'prompt number');
  try {
    await client.chat.completions.create({ model: modelId, messages: msgs, stop: 5 });
    throw new Error('no error');
  } catch (e) {
    eq(e.status, 400, 'stop number');
    eq(e.error && e.error.type, 'invalid_request_error', 'error type');
    assert(typeof (e.error && e.error.message) === 'string', 'error message');
  }
});

await check('errors: 404 and 405', async () => {
  eq(await status(client.get('/nope')), 404, 'unknown path');
  eq(await status(client.get('/chat/completions')), 405, 'GET on a POST endpoint');
  eq(await status(client.post('/models', { body: {} })), 405, 'POST on a GET endpoint');
});

await check('errors: 400 context exceeded', async () => {
  const long = 'word '.repeat(4000);
  eq(await status(client.completions.create({ model: modelId, prompt: long, max_tokens: 1 })), 400, 'status');
});

console.log(`NODE_DONE failed=${failed}`);
process.exit(0);
