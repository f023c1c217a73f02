import Foundation
import Testing
import UploadAgent
import UploadChecksums
import UploadRelay
import UploadTestSupport

/// Post-commit hooks (issue 10): each committed object's event reaches the hooks, through the catalog's outbox, however
/// they fail; uploads never wait for them.
@Suite("End to end: post-commit hooks")
struct HookTests {
    /// Hooks that retry fast, so that a test sees a retry within a second.
    static func hooks(command: String? = nil, url: String? = nil) -> CommitHooks {
        var hooks = CommitHooks(command: command, url: url)
        hooks.timeout = .seconds(1)
        hooks.retryDelay = .milliseconds(100)
        hooks.maxRetryDelay = .milliseconds(400)
        hooks.pollInterval = .milliseconds(100)
        return hooks
    }

    /// Whether the outbox empties within 30 s.
    static func outboxDrained(_ relay: TestRelay) async throws -> Bool {
        try await Polling.eventually(timeout: 30) { try await relay.parts.catalog.commitEventBacklog().count == 0 }
    }

    /// A Python HTTP server on a free loopback port for `--on-commit-url`: `state` at module level, `post` as the body of
    /// its POST handler (indented by the caller's four spaces), `sys.argv[1]` being `output`. Ready once its port is known.
    static func hookServer(work: String, output: String, state: String, post: String) throws -> ChildProcess {
        let handler = post.split(separator: "\n", omittingEmptySubsequences: false).map { "        " + $0 }.joined(separator: "\n")
        let script = """
            import http.server, json, sys, os
            \(state)
            class H(http.server.BaseHTTPRequestHandler):
                def do_POST(self):
            \(handler)
                def log_message(self, *a): pass
            s = http.server.HTTPServer(("127.0.0.1", 0), H)
            open(sys.argv[2] + ".tmp", "w").write(str(s.server_address[1])); os.rename(sys.argv[2] + ".tmp", sys.argv[2])
            s.serve_forever()
            """
        return try ChildProcess(
            "/usr/bin/env", ["python3", "-c", script, output, work + "/ready"], readyFile: work + "/ready", logFile: work + "/server.log"
        )
    }

    static func lines(_ path: String) -> [[String: Any]] {
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    @Test(
        "--on-commit: every object's event reaches the command as JSON and variables; one that fails is retried, one that hangs is killed and retried; uploads do not wait"
    )
    func command() async throws {
        let work = TestRelay.makeDirectory()
        let script = work + "/hook.sh"
        // flaky/ fails its first delivery; slow/ hangs in its first, past the 1 s timeout; the rest succeed at once.
        try """
        #!/bin/sh
        event=$(cat)
        case "$UPLOAD_KEY" in
            flaky/*) [ "$UPLOAD_ATTEMPT" -ge 2 ] || exit 3 ;;
            slow/*) [ "$UPLOAD_ATTEMPT" -ge 2 ] || sleep 60 ;;
        esac
        printf '%s\\n' "$event" >> \(work)/events.jsonl
        printf '%s %s %s\\n' "$UPLOAD_KEY" "$UPLOAD_SIZE" "$UPLOAD_SHA1" >> \(work)/variables.txt
        """.write(toFile: script, atomically: true, encoding: .utf8)
        // A timeout long enough for a hook that does not hang to end within it on a loaded machine (with 1 s a photo's
        // hook was once killed and run again: a second attempt, and the test failed); slow/ sleeps far past it.
        let relay = try await TestRelay {
            var hooks = Self.hooks(command: "/bin/sh " + script)
            hooks.timeout = .seconds(4)
            $0.hooks = hooks
        }.start()
        let source = TestRelay.makeDirectory()
        var files: [String: Data] = [:]
        var items: [UploadItem] = []
        for (index, key) in ["photos/a.jpg", "flaky/b.jpg", "slow/c.jpg", "photos/d.jpg"].enumerated() {
            let file = makeFile(source, "f\(index)", size: 10_000 + index * 333, seed: UInt64(60 + index))
            files[key] = file.data
            items.append(UploadItem(key: key, displayPath: file.path, source: FileSource(path: file.path)))
        }
        let started = Date()
        let results = try await upload(items, port: relay.port, token: relay.token, ca: relay.caPath)
        let took = Date().timeIntervalSince(started)
        #expect(results.allSatisfy { $0.status == .stored }, "\(results.compactMap(\.error))")
        let drained = try await Self.outboxDrained(relay)
        let backlog = try? await relay.parts.catalog.commitEventBacklog()
        #expect(drained, "events still queued: \(String(describing: backlog))")
        // The uploads did not wait for the hung hook (killed after 1 s, retried after).
        #expect(took < 30, "the uploads took \(took) s")
        // At least once: every key's event came, and none that failed or hung on its first delivery came from it.
        let events = Self.lines(work + "/events.jsonl")
        #expect(Set(events.compactMap { $0["key"] as? String }) == Set(files.keys), "\(events)")
        for event in events {
            let key = try #require(event["key"] as? String)
            let data = try #require(files[key])
            #expect(event["event"] as? String == "commit")
            #expect(event["account"] as? String == "dev")
            #expect(event["size"] as? Int == data.count)
            #expect(event["sha1"] as? String == SHA1Hex.of(data))
            let location = try #require(event["location"] as? String)
            #expect(FileManager.default.contents(atPath: location) == data, "\(location)")
            #expect((event["attempt"] as? Int ?? 0) >= (key.hasPrefix("photos/") ? 1 : 2), "\(key): \(event)")
        }
        let variables = (try? String(contentsOfFile: work + "/variables.txt", encoding: .utf8)) ?? ""
        #expect(variables.contains("photos/a.jpg \(files["photos/a.jpg"]?.count ?? 0) \(SHA1Hex.of(files["photos/a.jpg"] ?? Data()))"))
        await relay.stop()
    }

    @Test("--on-commit-url: the event POSTed as JSON; a 500 answer retried until a 2xx")
    func url() async throws {
        let work = TestRelay.makeDirectory()
        // A server that answers 500 to each key's first POST and 204 after, keeping the bodies it accepted.
        let server = try Self.hookServer(
            work: work, output: work + "/posted.jsonl",
            state: "seen = set()",
            post: """
                body = self.rfile.read(int(self.headers["Content-Length"]))
                key = json.loads(body)["key"]
                if key not in seen:
                    seen.add(key); self.send_response(500); self.end_headers(); return
                open(sys.argv[1], "ab").write(body)
                self.send_response(204); self.end_headers()
                """
        )
        defer {
            server.kill(SIGKILL)
            _ = server.waitForExit()
        }
        let port = try await server.waitUntilReady()
        let endpoint = try #require(URL(string: "http://127.0.0.1:\(port)/events"))
        let relay = try await TestRelay { $0.hooks = Self.hooks(url: endpoint.absoluteString) }.start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "IMG_1.jpg", size: 30_000, seed: 71)
        let results = try await upload(
            [UploadItem(key: "IMG_1.jpg", displayPath: file.path, source: FileSource(path: file.path))],
            port: relay.port, token: relay.token, ca: relay.caPath
        )
        #expect(results.first?.status == .stored)
        #expect(try await Self.outboxDrained(relay))
        let posted = Self.lines(work + "/posted.jsonl")
        #expect(posted.count == 1, "\(posted)")
        #expect(posted.first?["key"] as? String == "IMG_1.jpg")
        #expect(posted.first?["attempt"] as? Int == 2)
        #expect(posted.first?["sha1"] as? String == SHA1Hex.of(file.data))
        await relay.stop()
    }

    @Test(
        "hook secrets: a URL's user and password go as Basic authentication, never into messages or the catalog with its query; a command gets a minimal environment and the variables named"
    )
    func secrets() async throws {
        let work = TestRelay.makeDirectory()
        // Answers 503 to the first POST (so the relay records and logs a failure), 204 after; keeps each request's
        // Authorization header and path.
        let server = try Self.hookServer(
            work: work, output: work + "/requests.jsonl",
            state: "",
            post: """
                self.rfile.read(int(self.headers["Content-Length"]))
                open(sys.argv[1], "a").write(json.dumps({"authorization": self.headers.get("Authorization"), "path": self.path}) + "\\n")
                ok = os.path.exists(os.path.dirname(sys.argv[1]) + "/accept")
                self.send_response(204 if ok else 503); self.end_headers()
                """
        )
        defer {
            server.kill(SIGKILL)
            _ = server.waitForExit()
        }
        let port = try await server.waitUntilReady()
        setenv("UPLOAD_HOOK_TEST_PASSED", "passed-on", 1)
        setenv("UPLOAD_HOOK_TEST_SECRET", "never-in-a-hook", 1)
        let url = "http://hook-user:PA%24SWORD@127.0.0.1:\(port)/events?token=SECRET-TOKEN"
        let relay = try await TestRelay {
            var hooks = Self.hooks(command: "env > \(work)/env.txt", url: url)
            hooks.timeout = .seconds(4)
            hooks.environment = ["UPLOAD_HOOK_TEST_PASSED"]
            $0.hooks = hooks
        }.start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "IMG_2.jpg", size: 20_000, seed: 73)
        let results = try await upload(
            [UploadItem(key: "IMG_2.jpg", displayPath: file.path, source: FileSource(path: file.path))],
            port: relay.port, token: relay.token, ca: relay.caPath
        )
        #expect(results.first?.status == .stored)
        // The failures (503 until the test lets the server accept) are recorded with the URL as messages show it.
        var lastError = ""
        let failed = try await Polling.eventually(timeout: 30) {
            lastError = try await relay.parts.catalog.commitEventBacklog().lastError ?? ""
            return !lastError.isEmpty
        }
        // Whatever the failure (a 503, or on a loaded machine a request past the hook's timeout), the URL as messages show it.
        #expect(failed && lastError.contains("http://127.0.0.1:\(port)/…") && !lastError.contains("events"), "\(lastError)")
        #expect(FileManager.default.createFile(atPath: work + "/accept", contents: nil))
        #expect(try await Self.outboxDrained(relay))
        for secret in ["PA$SWORD", "PA%24SWORD", "SECRET-TOKEN", "hook-user"] {
            #expect(!lastError.contains(secret), "the catalog keeps \(secret): \(lastError)")
        }
        let requests = Self.lines(work + "/requests.jsonl")
        #expect(requests.count >= 2, "\(requests)")
        let basic = "Basic " + Data("hook-user:PA$SWORD".utf8).base64EncodedString()
        #expect(requests.allSatisfy { $0["authorization"] as? String == basic }, "\(requests)")
        #expect(requests.allSatisfy { $0["path"] as? String == "/events?token=SECRET-TOKEN" }, "\(requests)")

        let environment = (try? String(contentsOfFile: work + "/env.txt", encoding: .utf8)) ?? ""
        let names = Set(environment.split(separator: "\n").map { String($0.prefix { $0 != "=" }) })
        #expect(names.contains("UPLOAD_KEY") && names.contains("PATH") && names.contains("UPLOAD_HOOK_TEST_PASSED"), "\(names.sorted())")
        for hidden in ["UPLOAD_HOOK_TEST_SECRET", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "UPLOAD_TEST_POSTGRES_URL", "UPLOAD_RELAY_CATALOG"] {
            #expect(!names.contains(hidden), "a hook got \(hidden)")
        }
        #expect(HookEndpoint.redacted("https://u:p@h.example:8443/a/b?x=1#f") == "https://h.example:8443/…")
        #expect(HookEndpoint.redacted("alice:s3cret@hooks.internal/x") == "(not an http:// or https:// URL)")
        await relay.stop()
    }

    @Test(
        "the example hook tools/hooks/jpeg-preview.py: a preview of each JPEG, at most 320 pixels, outside the relay's store (<store>.previews); other files left alone"
    )
    func jpegPreview() async throws {
        let source = TestRelay.makeDirectory()
        let photo = source + "/IMG_0001.jpg"
        let made = Process()
        made.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        made.arguments = [
            "python3", "-c", "import sys; from PIL import Image; Image.new('RGB', (1600, 1200), (200, 40, 40)).save(sys.argv[1], 'JPEG')", photo,
        ]
        try made.run()
        made.waitUntilExit()
        try #require(made.terminationStatus == 0, "Pillow is needed (pip install Pillow)")
        let notJPEG = makeFile(source, "IMG_0002.jpg", size: 5_000, seed: 72)
        let hook = "python3 " + packageRoot + "/tools/hooks/jpeg-preview.py"
        let relay = try await TestRelay { $0.hooks = Self.hooks(command: hook) }.start()
        let results = try await upload(
            [
                UploadItem(key: "DCIM/IMG_0001.jpg", displayPath: photo, source: FileSource(path: photo)),
                UploadItem(key: "DCIM/IMG_0002.jpg", displayPath: notJPEG.path, source: FileSource(path: notJPEG.path)),
            ],
            port: relay.port, token: relay.token, ca: relay.caPath
        )
        #expect(results.allSatisfy { $0.status == .stored }, "\(results.compactMap(\.error))")
        #expect(try await Self.outboxDrained(relay))
        // Never inside the store, where it could replace an object the catalog vouches for.
        let preview = relay.storePath + ".previews/dev/DCIM/IMG_0001.jpg.preview.jpg"
        #expect(!FileManager.default.fileExists(atPath: relay.storePath + "/dev/DCIM/IMG_0001.jpg.preview.jpg"))
        let size = Process()
        size.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        size.arguments = ["python3", "-c", "import sys; from PIL import Image; i = Image.open(sys.argv[1]); print(i.format, *i.size)", preview]
        let out = Pipe()
        size.standardOutput = out
        try size.run()
        size.waitUntilExit()
        let said = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(said.trimmingCharacters(in: .whitespacesAndNewlines) == "JPEG 320 240", "\(said)")
        #expect(!FileManager.default.fileExists(atPath: relay.storePath + ".previews/dev/DCIM/IMG_0002.jpg.preview.jpg"))
        await relay.stop()
    }

    @Test(
        "through the relay binary, --hook-timeout 2s: a hook that ignores TERM is killed at its timeout and retried, one that leaves a background job holding its output is over when it exits, the next event is delivered, and SIGTERM stops the relay within the timeout plus 10 s"
    )
    func hooksThatHold() async throws {
        let work = TestRelay.makeDirectory()
        let data = work + "/data"
        var leftBehind: [Int32] = []
        defer {
            for pid in leftBehind { kill(pid, SIGKILL) }
            try? FileManager.default.removeItem(atPath: work)
        }
        // trap*: ignores TERM and sleeps on its first attempt; bg*: leaves a job of its own session holding the output;
        // hang*: ignores TERM and sleeps on every attempt, its pid noted.
        try """
        #!/bin/sh
        case "$UPLOAD_KEY" in
            trap*) if [ "$UPLOAD_ATTEMPT" -lt 2 ]; then trap '' TERM; sleep 1000; fi ;;
            bg*) setsid sleep 1000 & echo $! >> \(work)/background.pids ;;
            hang*) trap '' TERM; echo $$ >> \(work)/hang.pids; sleep 1000 ;;
        esac
        printf '%s %s\\n' "$UPLOAD_KEY" "$UPLOAD_ATTEMPT" >> \(work)/delivered.txt
        """.write(toFile: work + "/hook.sh", atomically: true, encoding: .utf8)
        let relay = try ChildProcess(
            try relayBinary(),
            [
                "serve", "--dev", "--data", data, "--listen", "127.0.0.1:0", "--ready-file", work + "/ready", "--on-commit",
                "/bin/sh " + work + "/hook.sh", "--hook-timeout", "2s", "--hook-concurrency", "1",
            ],
            readyFile: work + "/ready", logFile: work + "/relay.log"
        )
        defer {
            relay.kill(SIGKILL)
            _ = relay.waitForExit()
        }
        let port = try await relay.waitUntilReady()
        let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        func send(_ names: [String]) async throws {
            let paths = names.enumerated().map { makeFile(work, $0.element, size: 5_000 + $0.offset, seed: UInt64(90 + $0.offset)).path }
            let sent = try await CommandLineTests.run(
                try CommandLineTests.agentBinary(),
                ["send", "--no-state", "--relay", "127.0.0.1:\(port)", "--ca", data + "/dev/ca.pem", "--token", token] + paths
            )
            #expect(sent.status == 0, "\(sent.stderr)")
        }
        func delivered() -> [String] {
            ((try? String(contentsOfFile: work + "/delivered.txt", encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }
        try await send(["trap.jpg", "bg.jpg", "last.jpg"])
        let all = try await Polling.eventually(timeout: 30) { Set(delivered().map { $0.split(separator: " ")[0] }).count == 3 }
        leftBehind += ((try? String(contentsOfFile: work + "/background.pids", encoding: .utf8)) ?? "").split(separator: "\n").compactMap {
            Int32($0)
        }
        #expect(all, "delivered: \(delivered()); \(relay.log)")
        #expect(delivered().contains("trap.jpg 2"), "the TERM-ignoring hook was killed and its event delivered again: \(delivered())")
        #expect(delivered().contains("bg.jpg 1") && delivered().contains("last.jpg 1"), "\(delivered())")

        // A hook that never ends, whatever it is sent: SIGTERM stops the relay within the timeout plus 10 s, the hook gone.
        try await send(["hang.jpg"])
        let started = try await Polling.eventually(timeout: 30) { FileManager.default.fileExists(atPath: work + "/hang.pids") }
        try #require(started, "\(relay.log)")
        let hook = Int32(((try? String(contentsOfFile: work + "/hang.pids", encoding: .utf8)) ?? "").split(separator: "\n").first ?? "") ?? 0
        let stopping = Date()
        relay.kill(SIGTERM)
        let status = relay.waitForExit()
        let took = Date().timeIntervalSince(stopping)
        #expect(took < 12, "the relay took \(took) s to stop with a hook running")
        #expect(status == 0, "\(relay.log)")
        // Killed with its group by the relay; reaped by init once the relay is gone.
        let gone = try await Polling.eventually(timeout: 10) { hook > 0 && kill(hook, 0) != 0 }
        #expect(gone, "the hook \(hook) outlived the relay")
        if hook > 0 { leftBehind.append(hook) }
    }
}

/// Lowercase hex SHA-1, as events carry it.
enum SHA1Hex {
    static func of(_ data: Data) -> String {
        SHA1.hash(Array(data)).map { $0 < 16 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }
}
