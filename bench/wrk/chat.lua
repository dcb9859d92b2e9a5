-- wrk script: POST a real chat completion body, as an OpenAI client would.
--
--   wrk -c32 -t2 -d10s -s bench/wrk/chat.lua http://127.0.0.1:8080/v1/chat/completions
--   wrk ... -s bench/wrk/chat.lua <url> -- stream        (stream: true, SSE reply)
--   wrk ... -s bench/wrk/chat.lua <url> -- stream max_tokens=180 key=test-key
--
-- Arguments after `--` (any order):
--   stream          ask for an SSE reply ("stream": true)
--   usage           with stream: also "stream_options": {"include_usage": true}
--   max_tokens=N    the request's max_tokens (default 16; 180 with stream)
--   model=NAME      the request's model (default "mock-model")
--   key=KEY         the bearer key (default "test-key", sluice's embedded default)
--   dialect=D       chat (default), responses or messages: the same conversation in
--                   that API's request shape (POST it to /v1/responses, /v1/messages)
--
-- The request is built once per thread and sent unchanged, so the load
-- generator spends no Lua time per request. At the end it prints one line
-- that bench scripts parse (see report.lua):
--   WRK_RESULT requests=.. duration_us=.. rps=.. bytes=.. p50_us=.. ...

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local report = dofile(here .. "report.lua")

-- The same conversation in the Responses or Messages dialect (dialect=...).
local system_text = 'You are a concise assistant. Answer in plain English, cite no sources, and keep every answer ' ..
   'under a hundred words unless the user asks for more detail.'
local user_text = 'Explain in two or three sentences why a reverse proxy in front of an inference server should ' ..
   'stream tokens to the client as soon as they arrive instead of buffering the whole reply, and what a client ' ..
   'sees when it does buffer.'

local function build_dialect_body(opts)
   local stream = opts.stream and ',"stream":true' or ''
   if opts.dialect == "responses" then
      return table.concat({'{"model":"', opts.model, '","instructions":"', system_text, '",',
         '"input":[{"role":"user","content":[{"type":"input_text","text":"', user_text, '"}]}],',
         '"max_output_tokens":', tostring(opts.max_tokens), ',"temperature":0.7', stream, '}'})
   end
   return table.concat({'{"model":"', opts.model, '","system":"', system_text, '",',
      '"messages":[{"role":"user","content":"', user_text, '"}],',
      '"max_tokens":', tostring(opts.max_tokens), ',"temperature":0.7', stream, '}'})
end

local function build_body(opts)
   if opts.dialect ~= "chat" then return build_dialect_body(opts) end
   -- A realistic chat body: a system prompt and a user turn (~600 B), the
   -- size and shape a chat UI sends; sluice parses and validates all of it.
   local parts = {
      '{"model":"', opts.model, '",',
      '"messages":[',
      '{"role":"system","content":"You are a concise assistant. Answer in plain ',
      'English, cite no sources, and keep every answer under a hundred words ',
      'unless the user asks for more detail."},',
      '{"role":"user","content":"Explain in two or three sentences why a ',
      'reverse proxy in front of an inference server should stream tokens to ',
      'the client as soon as they arrive instead of buffering the whole reply, ',
      'and what a client sees when it does buffer."}',
      '],',
      '"max_tokens":', tostring(opts.max_tokens), ',',
      '"temperature":0.7',
   }
   if opts.stream then
      parts[#parts + 1] = ',"stream":true'
      if opts.usage then
         parts[#parts + 1] = ',"stream_options":{"include_usage":true}'
      end
   end
   parts[#parts + 1] = '}'
   return table.concat(parts)
end

-- chat-stream.lua sets CHAT_STREAM before loading this file.
local opts = {
   stream = CHAT_STREAM == true,
   usage = false,
   max_tokens = nil,
   model = "mock-model",
   key = "test-key",
   dialect = "chat",
}

function init(args)
   for _, a in ipairs(args) do
      local k, v = a:match("^([%w_]+)=(.*)$")
      if a == "stream" then opts.stream = true
      elseif a == "usage" then opts.usage = true
      elseif k == "max_tokens" then opts.max_tokens = tonumber(v)
      elseif k == "model" then opts.model = v
      elseif k == "key" then opts.key = v
      elseif k == "dialect" and (v == "chat" or v == "responses" or v == "messages") then opts.dialect = v
      else error("chat.lua: unknown argument '" .. a .. "'") end
   end
   if not opts.max_tokens then
      opts.max_tokens = opts.stream and 180 or 16
   end
   wrk.method = "POST"
   wrk.body = build_body(opts)
   wrk.headers["Content-Type"] = "application/json"
   wrk.headers["Authorization"] = "Bearer " .. opts.key
   -- Stock OpenAI SDKs send this even for streams (the body decides).
   wrk.headers["Accept"] = "application/json"
   if opts.dialect == "messages" then
      -- The Anthropic SDK's headers: its key as x-api-key, the API version.
      wrk.headers["Authorization"] = nil
      wrk.headers["x-api-key"] = opts.key
      wrk.headers["anthropic-version"] = "2023-06-01"
   end
end

done = report.done
