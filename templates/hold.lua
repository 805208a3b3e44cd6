-- Managed by engine-ctl (the gateway's Lua): held requests, JSON depth, per-key rate limits and GET /v1/models.
-- content-sha256: {{ content_hash }}
local HOLD_MS = {{ hold_s * 1000 }}
local STEP_MS = 250
local CAP = {{ hold_cap }}
local PREFIX = "{{ backend_prefix }}"
local held = {}
local holds, hold_timeouts, hold_full, wakes = {}, {}, {}, {}
local function bump(counts, name)
    counts[name] = (counts[name] or 0) + 1
end
local scopes = Map.new("scopes.map", Map._str)

-- The scaler's wake (engine-ctl-scaler on port {{ wake_port }}: this host's own at 127.0.0.1, else the first
-- gateway host's): a held request pokes the first that listens with `wake <deployment>` and never waits for an
-- answer; the scaler starts one replica per deployment (single-flight) whether or not the client stays (with a
-- scaler on every gateway host, one that does not act passes the wake to the one that does). Poked again every
-- WAKE_EVERY_MS while held, in case the scaler restarted.
local WAKE_ADDRESSES = { {% for a in wake_addresses %}"{{ a }}"{{ ", " if not loop.last }}{% endfor %} }
local WAKE_PORT = {{ wake_port }}
local WAKE_EVERY_MS = 5000
local function wake(name)
    bump(wakes, name)
    for _, address in ipairs(WAKE_ADDRESSES) do
        local s = core.tcp()
        s:settimeout(1)
        local heard = s:connect(address, WAKE_PORT)
        if heard then
            s:send("wake " .. string.sub(name, #PREFIX + 1) .. "\n")
        end
        s:close()
        if heard then
            return
        end
    end
end

local function serving(name)
    local backend = core.backends[name]
    if backend == nil then
        return false
    end
    for _, server in pairs(backend.servers) do
        local status = server:get_stats().status or ""
        if string.sub(status, 1, 2) == "UP" then
            return true
        end
    end
    return false
end

-- Hold a request while its deployment has no serving replica: let it through as soon as one serves, or
-- set txn.hold (the configuration answers 503 with Retry-After: 5) after HOLD_MS or beyond CAP held.
core.register_action("hold", { "http-req" }, function(txn)
    local name = txn:get_var("txn.backend")
    if name == nil or serving(name) then
        return
    end
    local count = held[name] or 0
    if count >= CAP then
        bump(hold_full, name)
        txn:set_var("txn.hold", "full")
        return
    end
    held[name] = count + 1
    bump(holds, name)
    local waited = 0
    wake(name)
    while waited < HOLD_MS do
        core.msleep(STEP_MS)
        waited = waited + STEP_MS
        if waited % WAKE_EVERY_MS == 0 then
            wake(name)
        end
        if serving(name) then
            held[name] = held[name] - 1
            return
        end
    end
    held[name] = held[name] - 1
    bump(hold_timeouts, name)
    txn:set_var("txn.hold", "timeout")
end, 0)

-- A JSON body nested deeper than MAX_DEPTH is refused (400) before it reaches an engine: an engine's JSON parser
-- may recurse once a level (llama-server's crashes with SIGSEGV past about 100,000 levels). The scan jumps from one
-- bracket or quote to the next (string.find), so a request costs one pass over its body's brackets, and stops at
-- the first level past the bound; brackets inside strings do not count.
local MAX_DEPTH = {{ json_depth_limit }}
local find, byte = string.find, string.byte
local function too_deep(body)
    local depth, pos = 0, 1
    while true do
        local at = find(body, '[%[%]{}"]', pos)
        if at == nil then
            return false
        end
        local c = byte(body, at)
        pos = at + 1
        if c == 34 then -- a string: on to its closing quote, past escaped characters
            while true do
                local q = find(body, '["\\]', pos)
                if q == nil then
                    return false
                end
                if byte(body, q) == 92 then
                    pos = q + 2
                else
                    pos = q + 1
                    break
                end
            end
        elseif c == 91 or c == 123 then
            depth = depth + 1
            if depth > MAX_DEPTH then
                return true
            end
        else
            depth = depth - 1
        end
    end
end

core.register_action("depth", { "http-req" }, function(txn)
    local body = txn.f:req_body()
    if body ~= nil and #body > MAX_DEPTH * 2 and too_deep(body) then
        txn:set_var("txn.too_deep", MAX_DEPTH)
    end
end, 0)

-- Requests a minute per API key (limits.map, read by the configuration into txn.key_rpm): a token bucket per key
-- name, full (key_rpm requests) at first and refilled at key_rpm / 60 a second. A request takes one token; with
-- none left it is refused: txn.rate_wait is the whole seconds until a token is back (the answer's Retry-After: a
-- client that waits that long is let through). txn.rate_left and txn.rate_reset (seconds until full) go into the
-- x-ratelimit-* headers. Counted per gateway host and per HAProxy process: a reload starts every bucket full.
local buckets = {}
core.register_action("ratelimit", { "http-req" }, function(txn)
    local key = txn:get_var("txn.key")
    local limit = tonumber(txn:get_var("txn.key_rpm"))
    if key == nil or limit == nil or limit < 1 then
        return
    end
    local clock = core.now()
    local now = clock.sec + clock.usec / 1000000
    local per_s = limit / 60
    local b = buckets[key]
    if b == nil then
        b = { tokens = limit, at = now }
        buckets[key] = b
    end
    b.tokens = math.min(limit, b.tokens + math.max(0, now - b.at) * per_s)
    b.at = now
    if b.tokens >= 1 - 1e-9 then
        b.tokens = b.tokens - 1
    else
        txn:set_var("txn.rate_wait", math.max(1, math.ceil((1 - b.tokens) / per_s)))
    end
    txn:set_var("txn.rate_left", math.floor(b.tokens + 1e-9))
    txn:set_var("txn.rate_reset", math.ceil((limit - b.tokens) / per_s))
end, 0)

-- GET /v1/models: every deployment the caller's key may use (scopes.map holds "<key>/<deployment>"); `created` is
-- when the deployment was created (epoch seconds, from its ID).
local CREATED = { {% for b in backends %}["{{ b.deployment }}"] = {{ b.created }}{{ ", " if not loop.last }}{% endfor %} }
local function model_object(deployment)
    return '{"id":"' .. deployment .. '","object":"model","created":' .. (CREATED[deployment] or 0) ..
        ',"owned_by":"engine-ctl"}'
end

local function answer(applet, status, body)
    applet:set_status(status)
    applet:add_header("content-type", "application/json")
    applet:add_header("content-length", string.len(body))
    applet:start_response()
    applet:send(body)
end

-- GET /v1/models/<id>: the model object of a deployment this key may use; anything else (unknown, out of the key's
-- scope, not a deployment's name) is the same 404 model_not_found as a request for it.
core.register_service("model", "http", function(applet)
    local key = applet:get_var("txn.key") or ""
    local id = string.sub(applet.path, #"/v1/models/" + 1)
    local known = string.match(id, "^[a-z0-9][a-z0-9-]*$") ~= nil and core.backends[PREFIX .. id] ~= nil
    if known and scopes:lookup(key .. "/" .. id) ~= nil then
        return answer(applet, 200, model_object(id))
    end
    local shown = string.gsub(id, '[^%w%-%._]', "?")
    answer(applet, 404, '{"error":{"message":"The model `' .. shown .. '` does not exist or you do not have ' ..
        'access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}')
end)

core.register_service("models", "http", function(applet)
    local key = applet:get_var("txn.key") or ""
    local names = {}
    for name, _ in pairs(core.backends) do
        if string.sub(name, 1, #PREFIX) == PREFIX then
            local deployment = string.sub(name, #PREFIX + 1)
            if scopes:lookup(key .. "/" .. deployment) ~= nil then
                table.insert(names, deployment)
            end
        end
    end
    table.sort(names)
    local items = {}
    for _, deployment in ipairs(names) do
        table.insert(items, model_object(deployment))
    end
    answer(applet, 200, '{"object":"list","data":[' .. table.concat(items, ",") .. "]}")
end)

-- GET /metrics/engine-ctl on the metrics port (Prometheus' text format): requests, errors and bytes per key name and
-- deployment (the api frontend's stick table: counted by HAProxy per request, read here only when scraped), and the
-- held requests and wakes per deployment (counted above). Counters start again from 0 when the gateway restarts or
-- reloads, as Prometheus' rate() and increase() expect of a counter.
local function label(value)
    return (string.gsub(value, '[^%w%-%._]', "_"))
end

local function per_deployment(out, metric, kind, help, counts)
    out[#out + 1] = "# HELP " .. metric .. " " .. help
    out[#out + 1] = "# TYPE " .. metric .. " " .. kind
    for name, _ in pairs(core.backends) do
        if string.sub(name, 1, #PREFIX) == PREFIX then
            out[#out + 1] = metric .. '{deployment="' .. label(string.sub(name, #PREFIX + 1)) .. '"} ' ..
                string.format("%d", counts[name] or 0)
        end
    end
end

-- The scaler's decisions so far per deployment and action: the scaler on this host keeps them in this map over
-- the stats socket ("<deployment>/<action>" -> count); a deployment it never decided for has none.
local decisions = Map.new("{{ decisions_map }}", Map._str)
local ACTIONS = { {% for a in actions %}"{{ a }}"{{ ", " if not loop.last }}{% endfor %} }

local function scaler_decisions(out)
    local metric = "engine_ctl_scaler_decisions_total"
    out[#out + 1] = "# HELP " .. metric .. " The scaler's decisions, by deployment and action."
    out[#out + 1] = "# TYPE " .. metric .. " counter"
    for name, _ in pairs(core.backends) do
        if string.sub(name, 1, #PREFIX) == PREFIX then
            local deployment = string.sub(name, #PREFIX + 1)
            for _, action in ipairs(ACTIONS) do
                local count = decisions:lookup(deployment .. "/" .. action)
                if count ~= nil then
                    out[#out + 1] = metric .. '{deployment="' .. label(deployment) .. '",action="' .. action ..
                        '"} ' .. count
                end
            end
        end
    end
end

local PER_KEY = {
    { "engine_ctl_requests_total", "http_req_cnt", "Requests routed to a deployment, by key name." },
    { "engine_ctl_client_errors_total", "http_err_cnt", "Of those, answered 4xx." },
    { "engine_ctl_server_errors_total", "http_fail_cnt", "Of those, answered 5xx (the gateway's own 503s included)." },
    { "engine_ctl_bytes_in_total", "bytes_in_cnt", "Bytes received from clients (headers and body)." },
    { "engine_ctl_bytes_out_total", "bytes_out_cnt", "Bytes sent to clients (headers and body)." },
}

core.register_service("metrics", "http", function(applet)
    local out = {}
    local rows = core.backends["ectl_usage"].stktable:dump()
    for _, series in ipairs(PER_KEY) do
        out[#out + 1] = "# HELP " .. series[1] .. " " .. series[3]
        out[#out + 1] = "# TYPE " .. series[1] .. " counter"
        for tracked, counters in pairs(rows) do
            local key, deployment = string.match(tracked, "^(.*)/([^/]*)$")
            if key ~= nil then
                out[#out + 1] = series[1] .. '{key="' .. label(key) .. '",deployment="' .. label(deployment) ..
                    '"} ' .. string.format("%d", counters[series[2]] or 0)
            end
        end
    end
    per_deployment(out, "engine_ctl_held_requests", "gauge", "Requests held now: no replica serving yet.", held)
    per_deployment(out, "engine_ctl_holds_total", "counter", "Requests held (a wake was sent).", holds)
    per_deployment(out, "engine_ctl_hold_timeouts_total", "counter", "Held requests answered 503 at the end of the hold.", hold_timeouts)
    per_deployment(out, "engine_ctl_hold_full_total", "counter", "Requests answered 503 at once: the hold cap was reached.", hold_full)
    per_deployment(out, "engine_ctl_wakes_total", "counter", "Wakes sent to the scaler.", wakes)
    scaler_decisions(out)
    local body = table.concat(out, "\n") .. "\n"
    applet:set_status(200)
    applet:add_header("content-type", "text/plain; version=0.0.4")
    applet:add_header("content-length", string.len(body))
    applet:start_response()
    applet:send(body)
end)
