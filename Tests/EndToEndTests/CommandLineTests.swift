import Foundation
import Testing
import UploadAgent
import UploadProtocol
import UploadChecksums
import UploadRelay
import UploadRelaySQLite
import UploadTestSupport

/// The programs as a user runs them: exit codes, --json, --help.
@Suite("End to end: the command-line programs", .serialized)
struct CommandLineTests {
    struct Run {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    /// Runs `executable` to its end, its output read whole; waited for on a thread of its own.
    static func run(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:], in directory: String? = nil
    ) async throws -> Run {
        try await onThreadOfItsOwn { try Self.runNow(executable, arguments, environment: environment, in: directory) }
    }

    /// ``run(_:_:environment:in:)`` waited for on the caller's thread: for a command that answers at once.
    static func runNow(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:], in directory: String? = nil
    ) throws -> Run {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        var env = ProcessInfo.processInfo.environment
        for key in ["UPLOAD_RELAY", "UPLOAD_TOKEN", "UPLOAD_CA", "UPLOAD_RELAY_DATA"] { env[key] = nil }
        // The agent's persistent queue: in a directory the tests remove, never in the user's home.
        env["XDG_STATE_HOME"] = env["XDG_STATE_HOME"] ?? Self.stateHome
        env.merge(environment) { $1 }
        process.environment = env
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Run(
            status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
            stderr: String(decoding: stderr, as: UTF8.self)
        )
    }

    static let stateHome = TestRelay.makeDirectory()

    /// `upload-relay serve --dev` in a temporary directory, and the environment that points an agent at it.
    struct DevRelay {
        let child: ChildProcess
        let data: String
        let port: Int
        let environment: [String: String]

        init(_ options: [String] = ["--log-level", "warning"]) async throws {
            self.data = TestRelay.makeDirectory()
            self.child = try ChildProcess(
                try relayBinary(),
                ["serve", "--dev", "--data", data, "--listen", "127.0.0.1:0", "--ready-file", data + "/ready"] + options,
                readyFile: data + "/ready", logFile: data + "/relay.log"
            )
            do {
                self.port = try await self.child.waitUntilReady()
                let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
                self.environment = ["UPLOAD_RELAY": "127.0.0.1:\(port)", "UPLOAD_CA": data + "/dev/ca.pem", "UPLOAD_TOKEN": token]
            } catch {
                self.child.kill(SIGTERM)
                _ = self.child.waitForExit()
                throw error
            }
        }

        func stop() {
            self.child.kill(SIGTERM)
            _ = self.child.waitForExit()
        }
    }

    /// `--json` output: one object per line.
    static func jsonLines(_ stdout: String) throws -> [[String: Any]] {
        try stdout.split(separator: "\n").map { line in
            try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "not a JSON object: \(line)")
        }
    }

    static func agentBinary() throws -> String {
        let path = packageRoot + "/.build/debug/upload-agent"
        guard FileManager.default.isExecutableFile(atPath: path) else {
            throw ChildProcess.ChildError(description: "\(path) is missing: run `swift build` before the tests (tools/test does)")
        }
        return path
    }

    @Test(
        "send --json: exit 0, one JSON object per item with the documented fields; then dedup; then exit 3 and error_code UNAUTHENTICATED on a bad token"
    )
    func sendJSON() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let (data, port, environment) = (relay.data, relay.port, relay.environment)
        // --dev prints the command to use, with the address and port it listens on (issue 6 finding 22).
        #expect(relay.child.log.contains("upload with: upload-agent send --relay 127.0.0.1:\(port) --ca \(data)/dev/ca.pem"), "\(relay.child.log)")
        let source = TestRelay.makeDirectory()
        let file = makeFile(source + "/trip", "day1/IMG_1.jpg", size: 300_000, seed: 31)
        _ = makeFile(source + "/trip", "notes.txt", size: 12, seed: 32)
        let agent = try Self.agentBinary()

        let first = try await Self.run(agent, ["send", "--json", source + "/trip"], environment: environment)
        #expect(first.status == 0, "\(first.stderr)")
        let lines = first.stdout.split(separator: "\n").map { try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
        #expect(lines.count == 2)
        let photo = try #require(lines.first { $0["key"] as? String == "trip/day1/IMG_1.jpg" })
        #expect(photo["status"] as? String == "stored")
        #expect(photo["bytes"] as? Int == 300_000)
        #expect(photo["sent_bytes"] as? Int == 300_000)
        #expect((photo["sha1"] as? String)?.count == 40)
        #expect(photo["path"] as? String == file.path)
        #expect(photo["error"] == nil && photo["error_code"] == nil)
        #expect(FileManager.default.contents(atPath: data + "/store/dev/trip/day1/IMG_1.jpg") == file.data)

        let again = try await Self.run(agent, ["send", "--json", source + "/trip"], environment: environment)
        #expect(again.status == 0)
        #expect(again.stdout.components(separatedBy: "\"status\":\"deduplicated\"").count == 3)
        #expect(again.stdout.contains("\"sent_bytes\":0"))

        var wrong = environment
        wrong["UPLOAD_TOKEN"] = "upl_wrong"
        let refused = try await Self.run(agent, ["send", "--json", file.path], environment: wrong)
        #expect(refused.status == 3, "\(refused.stderr)")
        #expect(refused.stdout.contains("\"status\":\"failed\""))
        #expect(refused.stdout.contains("\"error\""))
        #expect(refused.stdout.contains("\"error_code\":\"UNAUTHENTICATED\""), "\(refused.stdout)")
        #expect(refused.stderr.contains("unknown token"))
    }

    @Test(
        "serve refuses a limit below 1 (--io-threads, --commit-group, ...) or a --status-listen that is no host:port with a usage error naming it, before it creates anything"
    )
    func serveRefusesZeroLimits() async throws {
        let data = TestRelay.makeDirectory() + "/relay"
        for option in [
            "--io-threads", "--commit-group", "--max-connections", "--status-max-connections", "--reads-per-wakeup", "--lookups-per-connection",
        ] {
            let run = try await Self.run(try relayBinary(), ["serve", "--dev", "--data", data, "--listen", "127.0.0.1:0", option, "0"])
            #expect(run.status == 2, "\(option): exit \(run.status)")
            #expect(run.stderr.contains(option) && run.stderr.contains("must be at least 1"), "\(option): \(run.stderr)")
        }
        let status = try await Self.run(
            try relayBinary(), ["serve", "--dev", "--data", data, "--listen", "127.0.0.1:0", "--status-listen", "nowhere"])
        #expect(status.status == 2 && status.stderr.contains("--status-listen"), "\(status.stderr)")
        #expect(!FileManager.default.fileExists(atPath: data), "a refused serve created its data directory")
    }

    @Test(
        "no data directory named (--data or UPLOAD_RELAY_DATA): serve, token and ls are usage errors that say what to pass, and nothing is written in the current directory; UPLOAD_RELAY_DATA alone serves"
    )
    func dataDirectoryRequired() async throws {
        let cwd = TestRelay.makeDirectory()
        for arguments in [["serve", "--dev", "--listen", "127.0.0.1:0"], ["token", "add", "cam"], ["token", "list"], ["ls"]] {
            let run = try await Self.run(try relayBinary(), arguments, in: cwd)
            #expect(run.status == 2, "\(arguments): exit \(run.status) \(run.stderr)")
            #expect(run.stderr.contains("--data DIR") && run.stderr.contains("UPLOAD_RELAY_DATA"), "\(arguments): \(run.stderr)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: cwd).isEmpty, "written in the current directory")
        let data = cwd + "/named"
        let made = try await Self.run(try relayBinary(), ["token", "add", "cam"], environment: ["UPLOAD_RELAY_DATA": data], in: cwd)
        #expect(made.status == 0 && made.stdout.hasPrefix("upl_"), "\(made.stderr)")
        let listed = try await Self.run(try relayBinary(), ["token", "list"], environment: ["UPLOAD_RELAY_DATA": data], in: cwd)
        #expect(listed.status == 0 && listed.stdout.contains("cam"), "\(listed.stderr)")
        // token list --json: one object per account.
        _ = try await Self.run(try relayBinary(), ["token", "add", "quota-cam", "--quota", "5M", "--data", data], in: cwd)
        _ = try await Self.run(try relayBinary(), ["token", "revoke", "cam", "--data", data], in: cwd)
        let json = try await Self.jsonLines(try Self.run(try relayBinary(), ["token", "list", "--json", "--data", data], in: cwd).stdout)
        let byName = Dictionary(uniqueKeysWithValues: json.compactMap { line in (line["name"] as? String).map { ($0, line) } })
        #expect(byName["cam"]?["state"] as? String == "revoked" && byName["cam"]?["quota_bytes"] is NSNull, "\(json)")
        #expect(byName["quota-cam"]?["quota_bytes"] as? Int == 5 << 20 && byName["quota-cam"]?["used_bytes"] as? Int == 0, "\(json)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: cwd) == ["named"])
    }

    @Test("agent --log-level: a level that is none is a usage error naming the levels; debug shows the agent's own log lines on stderr")
    func agentLogLevel() async throws {
        let file = TestRelay.makeDirectory() + "/a.bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let wrong = try await Self.run(try Self.agentBinary(), ["send", "--relay", "127.0.0.1:1", "--token", "t", "--log-level", "loud", file])
        #expect(wrong.status == 2 && wrong.stderr.contains("--log-level must be one of"), "\(wrong.stderr)")
        // Nothing listens on port 1: the connection is refused, which the agent logs at debug.
        let quiet = try await Self.run(
            try Self.agentBinary(), ["send", "--relay", "127.0.0.1:1", "--token", "t", "--retry-for", "0s", "--json", file])
        let loud = try await Self.run(
            try Self.agentBinary(), ["send", "--relay", "127.0.0.1:1", "--token", "t", "--retry-for", "0s", "--json", "--log-level", "trace", file]
        )
        #expect(quiet.status != 0 && loud.status != 0)
        #expect(
            loud.stderr.split(separator: "\n").count > quiet.stderr.split(separator: "\n").count, "quiet:\n\(quiet.stderr)\nloud:\n\(loud.stderr)")
    }

    @Test(
        "token rotate, quota, disable and enable on a running relay: the old token is refused and its open connection closes; a quota refuses what does not fit and none lifts it; a disabled account is refused until enabled"
    )
    func tokenAdministration() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let home = TestRelay.makeDirectory()
        let small = home + "/small.bin"
        #expect(FileManager.default.createFile(atPath: small, contents: Data(repeating: 7, count: 4096)))
        func admin(_ arguments: [String]) async throws -> Run {
            try await Self.run(try relayBinary(), ["token"] + arguments + ["--data", relay.data])
        }
        func send(_ path: String, token: String? = nil, _ extra: [String] = []) async throws -> [String: Any] {
            var environment = relay.environment
            if let token { environment["UPLOAD_TOKEN"] = token }
            let run = try await Self.run(
                try Self.agentBinary(), ["send", "--json", "--no-state", "--retry-for", "0s", "--overwrite"] + extra + [path],
                environment: environment)
            return try #require(try Self.jsonLines(run.stdout).first, "\(run.stderr)")
        }
        await #expect(try send(small)["status"] as? String == "stored")

        // A large upload under way with the old token, throttled: the rotation closes its connection.
        let large = home + "/large.bin"
        #expect(FileManager.default.createFile(atPath: large, contents: Data(repeating: 1, count: 8 << 20)))
        let uploading = try AgentProcess(
            ["send", "--json", "--no-state", "--retry-for", "0s", "--bwlimit", "1M", large], environment: relay.environment, log: home + "/large.log"
        )
        defer { uploading.stop(SIGKILL) }
        #expect(
            try await AgentProcess.waitUntil {
                try Self.runNow(try relayBinary(), ["ls", "--in-progress", "--json", "--data", relay.data]).stdout.contains("large.bin")
            }, "\(uploading.child.log)"
        )
        let rotated = try await admin(["rotate", "dev"])
        #expect(rotated.status == 0 && rotated.stdout.hasPrefix("upl_"), "\(rotated.stderr)")
        let newToken = rotated.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        // Nothing of that run went up and the relay no longer takes its token: exit 3.
        #expect(await uploading.child.exited() == 3)
        #expect(uploading.child.log.contains("was replaced (token rotate)"), "\(uploading.child.log)")
        let refused = try await send(small)
        #expect(refused["status"] as? String == "failed" && (refused["error"] as? String ?? "").contains("token"), "\(refused)")
        await #expect(try send(small, token: newToken)["status"] as? String != "failed")

        // Quota: 1 KiB refuses a 4 KiB file that is new; none lifts it.
        let other = home + "/other.bin"
        #expect(FileManager.default.createFile(atPath: other, contents: Data(repeating: 9, count: 4096)))
        await #expect(try admin(["quota", "dev", "1K"]).status == 0)
        let json = try await Self.jsonLines(try Self.run(try relayBinary(), ["token", "list", "--json", "--data", relay.data]).stdout)
        #expect(json.first { $0["name"] as? String == "dev" }?["quota_bytes"] as? Int == 1024, "\(json)")
        let over = try await send(other, token: newToken)
        #expect((over["error"] as? String ?? "").contains("QUOTA_EXCEEDED"), "\(over)")
        #expect(over["error_code"] as? String == "QUOTA_EXCEEDED", "\(over)")
        await #expect(try admin(["quota", "dev", "none"]).status == 0)
        await #expect(try send(other, token: newToken)["status"] as? String == "stored")

        // Disable, enable.
        await #expect(try admin(["disable", "dev"]).status == 0)
        let disabled = try await send(small, token: newToken)
        #expect((disabled["error"] as? String ?? "").contains("revoked"), "\(disabled)")
        await #expect(try admin(["enable", "dev"]).status == 0)
        await #expect(try send(small, token: newToken)["status"] as? String != "failed")
        await #expect(try admin(["rotate", "nobody"]).status == 2)
    }

    @Test(
        "send checks the whole selection against the quota first: nothing is sent when it does not fit, each file said why; --send-what-fits sends what fits; files the relay holds count for nothing; --no-quota-check leaves it to the relay"
    )
    func quotaCheckedFirst() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let home = TestRelay.makeDirectory()
        let a = makeFile(home + "/sel", "a.bin", size: 30_000, seed: 41)
        func send(_ extra: [String], _ paths: [String]) async throws -> (status: Int32, lines: [[String: Any]], stderr: String) {
            let run = try await Self.run(
                try Self.agentBinary(), ["send", "--json", "--no-state", "--retry-for", "0s"] + extra + paths, environment: relay.environment
            )
            return (run.status, try Self.jsonLines(run.stdout), run.stderr)
        }
        func stored(_ name: String) -> Data? { FileManager.default.contents(atPath: relay.data + "/store/dev/sel/" + name) }
        await #expect(try send([], [home + "/sel"]).status == 0)
        #expect(stored("a.bin") == a.data)
        let b = makeFile(home + "/sel", "b.bin", size: 30_000, seed: 42)
        _ = makeFile(home + "/sel", "c.bin", size: 50_000, seed: 43)
        // 100 000 bytes, 30 000 used: the selection needs 80 000 (a.bin is there already), its sizes 110 000.
        await #expect(try Self.run(try relayBinary(), ["token", "quota", "dev", "100000", "--data", relay.data]).status == 0)

        let refused = try await send([], [home + "/sel"])
        #expect(refused.status == 1, "\(refused.stderr)")
        #expect(refused.lines.count == 3, "\(refused.lines)")
        for line in refused.lines {
            #expect(line["status"] as? String == "failed" && line["error_code"] as? String == "QUOTA_EXCEEDED", "\(line)")
            #expect(line["sent_bytes"] as? Int == 0)
        }
        let c = refused.lines.first { $0["key"] as? String == "sel/c.bin" }
        // Bound first: an optional chain inside #expect's receiver makes the check vacuous (it passes whatever the text).
        let cError = (c?["error"] as? String) ?? ""
        #expect(cError.contains("does not fit: it needs 48.8 KiB"), "\(String(describing: c))")
        // Smaller than the room left: the files before it take that room, and the message says so.
        #expect(cError.contains("the files that fit take the 68.4 KiB account \"dev\" has left"), "\(cError)")
        #expect(
            refused.lines.filter { ($0["error"] as? String ?? "").contains("not sent: the selection needs 78.1 KiB") }.count == 2, "\(refused.lines)")
        #expect(refused.stderr.contains("nothing was sent") && refused.stderr.contains("--send-what-fits"), "\(refused.stderr)")
        #expect(refused.stderr.contains("account \"dev\" has 68.4 KiB of its 97.7 KiB quota left"), "\(refused.stderr)")
        #expect(stored("b.bin") == nil)

        let fits = try await send(["--send-what-fits"], [home + "/sel"])
        #expect(fits.status == 1)
        let status = Dictionary(uniqueKeysWithValues: fits.lines.map { ($0["key"] as? String ?? "", $0["status"] as? String ?? "") })
        #expect(status == ["sel/a.bin": "deduplicated", "sel/b.bin": "stored", "sel/c.bin": "failed"], "\(fits.lines)")
        #expect(stored("b.bin") == b.data)
        #expect(fits.stderr.contains("1 of 3 files do not fit"), "\(fits.stderr)")

        // The quota now equals what is stored: sending what the relay holds again is not refused for its sizes.
        await #expect(try Self.run(try relayBinary(), ["token", "quota", "dev", "60000", "--data", relay.data]).status == 0)
        let again = try await send(["--prefix", "sel"], [a.path, b.path])
        #expect(again.status == 0, "\(again.lines) \(again.stderr)")
        #expect(again.lines.allSatisfy { $0["status"] as? String == "deduplicated" }, "\(again.lines)")

        // Without the check the relay refuses c.bin at OPEN, as before.
        let unchecked = try await send(["--no-quota-check"], [home + "/sel"])
        #expect(unchecked.status == 1)
        let late = unchecked.lines.first { $0["key"] as? String == "sel/c.bin" }
        #expect(
            late?["error_code"] as? String == "QUOTA_EXCEEDED" && !(late?["error"] as? String ?? "").contains("does not fit"), "\(unchecked.lines)")
    }

    @Test(
        "a relay that cannot be reached: one line naming the address and what to check, said once however often it is retried, then counted; never NIO's own description"
    )
    func unreachableRelayMessages() async throws {
        let file = TestRelay.makeDirectory() + "/a.bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let refused = try await Self.run(
            try Self.agentBinary(), ["send", "--json", "--relay", "127.0.0.1:1", "--token", "t", "--retry-for", "2s", file])
        #expect(refused.status == 3, "nothing went up, the relay unreachable: exit 3")
        #expect(refused.stdout.contains("\"error_code\":\"RELAY_UNREACHABLE\""), "\(refused.stdout)")
        #expect(
            refused.stderr.contains("cannot connect to the relay at 127.0.0.1:1: connection refused: is upload-relay running"), "\(refused.stderr)")
        #expect(refused.stderr.components(separatedBy: "reconnecting in").count == 2, "said more than once:\n\(refused.stderr)")
        #expect(refused.stderr.contains("times)"), "\(refused.stderr)")
        let unknown = try await Self.run(
            try Self.agentBinary(), ["send", "--relay", "no-such-host.invalid:7443", "--token", "t", "--retry-for", "0s", file])
        #expect(unknown.status == 3)
        #expect(unknown.stderr.contains("no-such-host.invalid"), "\(unknown.stderr)")
        for run in [refused, unknown] {
            #expect(!run.stderr.contains("SingleConnectionFailure") && !run.stderr.contains("NIOConnectionError"), "\(run.stderr)")
        }
    }

    @Test("serve whose --listen or --status-listen address is taken ends at once with exit 1, naming the option and the address")
    func serveAddressTaken() async throws {
        let holder = try await DevRelay()
        defer { holder.stop() }
        let taken = "127.0.0.1:\(holder.port)"
        for (option, listen, status) in [
            ("--status-listen", "127.0.0.1:0", taken),
            ("--listen", taken, "127.0.0.1:0"),
        ] {
            let data = TestRelay.makeDirectory()
            defer { try? FileManager.default.removeItem(atPath: data) }
            // Killed after 60 s if it does not end by itself (a relay that kept serving without its endpoint did not).
            let run = try await Self.run(
                "/usr/bin/timeout",
                ["-s", "KILL", "60", try relayBinary(), "serve", "--dev", "--data", data, "--listen", listen, "--status-listen", status]
            )
            #expect(run.status == 1, "\(option): exit \(run.status); \(run.stderr)")
            #expect(run.stderr.contains("cannot listen on \(taken) (\(option))") && run.stderr.contains("in use"), "\(option): \(run.stderr)")
        }
    }

    @Test(
        "what serve creates is private to its user whatever the umask (directories 0700, files 0600); --group-access lets the group read; relay and agent run without root's capabilities"
    )
    func fileModes() async throws {
        for groupAccess in [false, true] {
            let data = TestRelay.makeDirectory() + "/relay"
            defer { try? FileManager.default.removeItem(atPath: data) }
            // A umask that lets everyone read, as on most systems; and none of root's capabilities, as a service user
            // runs it (a socket option that needed one once kept every connection from opening).
            let child = try ChildProcess(
                "/bin/sh",
                [
                    "-c", "umask 022; exec setpriv --bounding-set=-all \"$0\" \"$@\"", try relayBinary(), "serve", "--dev", "--data", data,
                    "--listen", "127.0.0.1:0", "--ready-file",
                    data + ".ready",
                ] + (groupAccess ? ["--group-access"] : []),
                readyFile: data + ".ready", logFile: data + ".log"
            )
            let port = try await child.waitUntilReady()
            let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            let source = TestRelay.makeDirectory()
            defer { try? FileManager.default.removeItem(atPath: source) }
            _ = makeFile(source + "/album", "2026/IMG_1.jpg", size: 200_000, seed: 41)
            let sent = try await Self.run(
                "/usr/bin/setpriv", ["--bounding-set=-all", try Self.agentBinary(), "send", "--no-state", "--quiet", source + "/album"],
                environment: ["UPLOAD_RELAY": "127.0.0.1:\(port)", "UPLOAD_CA": data + "/dev/ca.pem", "UPLOAD_TOKEN": token]
            )
            #expect(sent.status == 0, "\(sent.stderr)")
            let (directoryMode, fileMode): (mode_t, mode_t) = groupAccess ? (0o750, 0o640) : (0o700, 0o600)
            func mode(_ path: String) -> mode_t? {
                var info = stat()
                return stat(path, &info) == 0 ? info.st_mode & 0o777 : nil
            }
            for directory in [data, data + "/staging", data + "/store", data + "/store/dev", data + "/store/dev/album/2026"] {
                #expect(mode(directory) == directoryMode, "\(directory): \(String(mode(directory) ?? 0, radix: 8))")
            }
            for file in [
                data + "/catalog.sqlite", data + "/catalog.sqlite-wal", data + "/catalog.sqlite-shm", data + "/store/dev/album/2026/IMG_1.jpg",
            ] {
                #expect(mode(file) == fileMode, "\(file): \(String(mode(file) ?? 0, radix: 8))")
            }
            child.kill(SIGTERM)
            #expect(await child.exited() == 0)
        }
    }

    @Test("serve with an S3 store: no keys, no bucket, or S3 options without one are usage errors that say what to set, before anything is created")
    func serveS3UsageErrors() async throws {
        let data = TestRelay.makeDirectory() + "/relay"
        // Empty keys count as none (tools/test exports the test server's).
        var environment = ["AWS_SHARED_CREDENTIALS_FILE": TestRelay.makeDirectory() + "/none"]
        for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"] { environment[name] = "" }
        let base = ["serve", "--dev", "--data", data, "--listen", "127.0.0.1:0"]
        let cases: [([String], String)] = [
            (["--store", "s3://photos/relay", "--s3-endpoint", "http://127.0.0.1:9"], "AWS_ACCESS_KEY_ID"),
            (["--store", "s3://", "--s3-endpoint", "http://127.0.0.1:9"], "s3://BUCKET"),
            (["--s3-endpoint", "http://127.0.0.1:9"], "--store s3://"),
            (["--store", "s3://photos", "--s3-endpoint", "ftp://x"], "http://"),
            (["--store", "S3://photos", "--s3-endpoint", "http://127.0.0.1:9/s3"], "no path"),
        ]
        for (options, hint) in cases {
            let run = try await Self.run(try relayBinary(), base + options, environment: environment)
            #expect(run.status == 2, "\(options): exit \(run.status)")
            #expect(run.stderr.contains(hint), "\(options): \(run.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: data), "a refused serve created its data directory")
    }

    @Test(
        "relay ls and token list: stored objects and uploads under way, by account, as a table in KiB/MiB (--bytes: exact) or JSON lines; an unknown account is a usage error"
    )
    func relayList() async throws {
        let relay = try await DevRelay()
        let source = TestRelay.makeDirectory()
        let photo = makeFile(source, "IMG_1.jpg", size: 12_345, seed: 3)
        let sent = try await Self.run(try Self.agentBinary(), ["send", "--no-state", photo.path], environment: relay.environment)
        #expect(sent.status == 0, "\(sent.stderr)")
        relay.stop()
        let binary = try relayBinary()
        await #expect(try Self.run(binary, ["token", "add", "other", "--data", relay.data]).status == 0)
        // An upload of "other" under way: its session, as a relay records it at its first durable sync.
        let catalog = try SQLiteCatalog(path: relay.data + "/catalog.sqlite")
        try await catalog.putSession(
            UploadSession(
                id: "s1", account: "other", key: "videos/big one.mov", resumeToken: [1], fingerprint: [2], declaredSize: 999_999,
                durableOffset: 123_456, sha1State: SHA1().exportState(), stagingName: "s1"
            )
        )
        let table = try await Self.run(binary, ["ls", "--data", relay.data])
        #expect(table.status == 0, "\(table.stderr)")
        #expect(table.stdout.contains("dev\tstored\t12.1 KiB\t12.1 KiB\tIMG_1.jpg"), "\(table.stdout)")
        #expect(table.stdout.contains("other\tuploading\t120.6 KiB\t976.6 KiB\tvideos/big one.mov"), "\(table.stdout)")
        let exact = try await Self.run(binary, ["ls", "--bytes", "--data", relay.data])
        #expect(exact.stdout.contains("dev\tstored\t12345\t12345\tIMG_1.jpg"), "\(exact.stdout)")
        #expect(exact.stdout.contains("other\tuploading\t123456\t999999\tvideos/big one.mov"), "\(exact.stdout)")
        let accounts = try await Self.jsonLines(try Self.run(binary, ["token", "list", "--json", "--data", relay.data]).stdout)
        let dev0 = try #require(accounts.first { $0["name"] as? String == "dev" })
        #expect(dev0["objects"] as? Int == 1 && dev0["stored_bytes"] as? Int == 12_345 && dev0["uploading"] as? Int == 0, "\(dev0)")
        let other = try #require(accounts.first { $0["name"] as? String == "other" })
        #expect(other["objects"] as? Int == 0 && other["uploading"] as? Int == 1 && other["uploading_bytes"] as? Int == 123_456, "\(other)")
        let accountTable = try await Self.run(binary, ["token", "list", "--data", relay.data]).stdout
        #expect(accountTable.contains("dev\t12.1 KiB\t-\t1\t0\tactive"), "\(accountTable)")
        let underWay = try await Self.jsonLines(try Self.run(binary, ["ls", "--data", relay.data, "--in-progress", "--json"]).stdout)
        #expect(underWay.count == 1)
        #expect(underWay.first?["key"] as? String == "videos/big one.mov")
        #expect(underWay.first?["status"] as? String == "uploading")
        #expect(underWay.first?["bytes"] as? Int == 123_456 && underWay.first?["size"] as? Int == 999_999)
        let dev = try await Self.jsonLines(try Self.run(binary, ["ls", "--data", relay.data, "--account", "dev", "--json"]).stdout)
        #expect(dev.map { $0["key"] as? String } == ["IMG_1.jpg"])
        #expect(dev.first?["sha1"] as? String == SHA1.hash(photo.data).map { String(format: "%02x", $0) }.joined())
        let unknown = try await Self.run(binary, ["ls", "--data", relay.data, "--account", "nobody"])
        #expect(unknown.status == 2 && unknown.stderr.contains("no account named \"nobody\""), "\(unknown.stderr)")
    }

    @Test("send --deflate --json: wire_bytes shows what deflate saved on text, and nothing on random bytes; both stored exactly")
    func wireBytes() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let (data, environment) = (relay.data, relay.environment)
        let source = TestRelay.makeDirectory()
        let text = Data((0..<40_000).map { "line \($0 % 100): the relay acknowledged the upload\n" }.joined().utf8)
        try FileManager.default.createDirectory(atPath: source + "/logs", withIntermediateDirectories: true)
        try text.write(to: URL(fileURLWithPath: source + "/logs/app.log"))
        let random = makeFile(source + "/logs", "clip.bin", size: 3_000_000, seed: 77)
        let run = try await Self.run(
            try Self.agentBinary(), ["send", "--deflate", "--no-dedup", "--json", source + "/logs"], environment: environment)
        #expect(run.status == 0, "\(run.stderr)")
        let lines = try Self.jsonLines(run.stdout)
        let log = try #require(lines.first { $0["key"] as? String == "logs/app.log" })
        let clip = try #require(lines.first { $0["key"] as? String == "logs/clip.bin" })
        let (logSent, logWire) = (log["sent_bytes"] as? Int ?? 0, log["wire_bytes"] as? Int ?? 0)
        #expect(logSent == text.count && logWire > 0 && logWire * 4 < logSent, "text: \(logWire) wire bytes for \(logSent)")
        #expect(clip["sent_bytes"] as? Int == 3_000_000 && clip["wire_bytes"] as? Int == 3_000_000)
        #expect(FileManager.default.contents(atPath: data + "/store/dev/logs/app.log") == text)
        #expect(FileManager.default.contents(atPath: data + "/store/dev/logs/clip.bin") == random.data)
    }

    @Test(
        "dedup probe: a new 3 MiB file is hashed over its first 256 KiB only and sent in one read; a copy of it is confirmed, hashed whole and not sent; the file itself again is known by its fingerprint, not read"
    )
    func dedupProbe() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let (data, environment) = (relay.data, relay.environment)
        let source = TestRelay.makeDirectory()
        let clip = makeFile(source, "clip.mp4", size: 3 << 20, seed: 88)
        func send(_ arguments: [String]) async throws -> [String: Any] {
            let run = try await Self.run(try Self.agentBinary(), ["send", "--json"] + arguments, environment: environment)
            #expect(run.status == 0, "\(run.stderr)")
            return try #require(try Self.jsonLines(run.stdout).first)
        }
        let first = try await send([clip.path])
        #expect(first["status"] as? String == "stored")
        #expect(first["hashed_bytes"] as? Int == Int(Frame.Open.probeLength), "only the probe is read before OPEN: \(first)")
        #expect(first["sent_bytes"] as? Int == 3 << 20)
        #expect(FileManager.default.contents(atPath: data + "/store/dev/clip.mp4") == clip.data)
        // A copy: the same bytes under another fingerprint, so the agent's hash cache cannot know them.
        try FileManager.default.createDirectory(atPath: source + "/copy", withIntermediateDirectories: true)
        try clip.data.write(to: URL(fileURLWithPath: source + "/copy/clip.mp4"))
        let again = try await send(["--prefix", "copy", source + "/copy/clip.mp4"])
        #expect(again["status"] as? String == "deduplicated", "\(again)")
        #expect(again["sent_bytes"] as? Int == 0)
        #expect(again["hashed_bytes"] as? Int == Int(Frame.Open.probeLength) + (3 << 20), "probe, then the whole file after CONFIRM: \(again)")
        #expect(FileManager.default.contents(atPath: data + "/store/dev/copy/clip.mp4") == clip.data)
        // The first file again: its upload taught the hash cache its SHA-1, so nothing is read at all.
        let third = try await send(["--prefix", "third", clip.path])
        #expect(third["status"] as? String == "deduplicated", "\(third)")
        #expect(third["sent_bytes"] as? Int == 0 && third["hashed_bytes"] as? Int == 0, "\(third)")
        #expect(FileManager.default.contents(atPath: data + "/store/dev/third/clip.mp4") == clip.data)
    }

    @Test(
        "the name verified is the one asked for: --server-name wrong.example against a certificate for localhost and 127.0.0.1 is refused, though it lists the address dialled (finding 7)"
    )
    func serverNameVerified() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let file = makeFile(source, "photo.jpg", size: 1000, seed: 70)
        let refused = try await Self.run(
            try Self.agentBinary(), ["send", "--json", "--no-state", "--retry-for", "5s", "--server-name", "wrong.example", file.path],
            environment: relay.environment)
        #expect(refused.status != 0, "\(refused.stdout) \(refused.stderr)")
        #expect((refused.stdout + refused.stderr).contains("wrong.example"), "\(refused.stdout) \(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: relay.data + "/store/dev/photo.jpg"))
        let named = try await Self.run(
            try Self.agentBinary(), ["send", "--json", "--no-state", "--server-name", "localhost", file.path], environment: relay.environment)
        #expect(named.status == 0, "\(named.stderr)")
    }

    @Test("send DIR holding café.txt twice, its name in NFC and in NFD: both stored, each under its own bytes (finding 11)")
    func canonicallyEquivalentNames() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let composed = "caf\u{E9}.txt"
        let decomposed = "cafe\u{301}.txt"
        #expect(composed == decomposed && Array(composed.utf8) != Array(decomposed.utf8), "Swift compares them equal; their bytes differ")
        let first = makeFile(source + "/names", composed, size: 300, seed: 71)
        let second = makeFile(source + "/names", decomposed, size: 400, seed: 72)
        let run = try await Self.run(try Self.agentBinary(), ["send", "--json", "--no-state", source + "/names"], environment: relay.environment)
        let lines = try Self.jsonLines(run.stdout)
        #expect(run.status == 0 && lines.count == 2, "\(run.stdout) \(run.stderr)")
        #expect(lines.allSatisfy { $0["status"] as? String == "stored" }, "\(run.stdout)")
        let stored = try FileManager.default.contentsOfDirectory(atPath: relay.data + "/store/dev/names").map { Array($0.utf8) }
        #expect(Set(stored) == [Array(composed.utf8), Array(decomposed.utf8)], "\(stored)")
        #expect(FileManager.default.contents(atPath: relay.data + "/store/dev/names/" + composed) == first.data)
        #expect(FileManager.default.contents(atPath: relay.data + "/store/dev/names/" + decomposed) == second.data)
    }

    @Test("send --json: names with quotes and accents come out as valid JSON, byte for byte")
    func jsonEscapes() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let environment = relay.environment
        let source = TestRelay.makeDirectory()
        // (Names with control characters or backslashes are refused before anything is sent: not valid keys.)
        let names = ["say \"hi\" & 'bye'.txt", "ünïcødé 写真.jpg", "dir/x {y}: [z].txt"]
        for (index, name) in names.enumerated() { _ = makeFile(source + "/odd", name, size: 100 + index, seed: UInt64(40 + index)) }
        let run = try await Self.run(try Self.agentBinary(), ["send", "--json", source + "/odd"], environment: environment)
        let lines = try Self.jsonLines(run.stdout)
        #expect(run.status == 0 && lines.count == names.count, "\(run.stdout) \(run.stderr)")
        for name in names {
            let line = lines.first { $0["path"] as? String == source + "/odd/" + name }
            #expect(line != nil, "no line with the path of \(name.debugDescription): \(run.stdout)")
            #expect(line?["key"] as? String == "odd/" + name)
            #expect(line?["status"] as? String == "stored")
        }
    }

    @Test(
        "kill -9 of the agent mid-upload, then the same command again: it resumes, re-sending at most what was not durable plus a window and a sync batch (finding 23)",
        arguments: [true, false]
    )
    func agentKilledThenRerun(dedup: Bool) async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let size = 96 << 20
        let file = makeFile(source, "big.bin", size: size, seed: dedup ? 41 : 42)
        let arguments =
            ["send", "--json", "--quiet", "--relay", "127.0.0.1:\(relay.port)", "--token", relay.token, "--ca", relay.caPath]
            + (dedup ? [] : ["--no-dedup"]) + [file.path]
        let agent = try ChildProcess(try Self.agentBinary(), arguments, readyFile: source + "/never", logFile: source + "/agent.log")
        // Kill it once the relay has staged a good part of the file (observed on disk, with a deadline).
        let staging = relay.parts.configuration.stagingDirectory
        let deadline = Date().addingTimeInterval(60)
        var staged = 0
        while staged < size * 2 / 5 && Date() < deadline && agent.process.isRunning {
            staged =
                ((try? FileManager.default.contentsOfDirectory(atPath: staging)) ?? []).compactMap {
                    (try? FileManager.default.attributesOfItem(atPath: staging + "/" + $0)[.size] as? Int) ?? nil
                }.max() ?? 0
            usleep(10_000)
        }
        agent.kill(SIGKILL)
        _ = agent.waitForExit()
        #expect(staged >= size * 2 / 5, "the agent did not get far enough: \(agent.log)")
        let durable = try await relay.parts.catalog.session(account: "dev", key: "big.bin")?.durableOffset ?? 0
        #expect(durable > 0)
        let rerun = try await Self.run(try Self.agentBinary(), arguments)
        #expect(rerun.status == 0, "\(rerun.stderr)")
        let result = try #require(try JSONSerialization.jsonObject(with: Data(rerun.stdout.utf8)) as? [String: Any])
        let sent = try #require(result["sent_bytes"] as? Int)
        let limits = relay.parts.configuration
        #expect(sent <= size - Int(durable) + limits.limits.streamWindow + limits.syncBytes, "sent \(sent) after \(durable) durable of \(size)")
        #expect(relay.stored("big.bin") == file.data)
        await relay.stop()
    }

    @Test(
        "send DIR: every path gets a result; links, unreadable directories, FIFOs and names that are not UTF-8 are skipped with why; names no key may have fail alone; the rest are stored; exit 1, or 0 with --allow-skipped for skips alone; -L follows links"
    )
    func sendReportsEveryPath() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer {
            chmod(source + "/album/locked", 0o755)
            chmod(source + "/album/listed", 0o755)
            try? FileManager.default.removeItem(atPath: source)
        }
        let album = source + "/album"
        let a = makeFile(album, "a.jpg", size: 10_000, seed: 51)
        let z = makeFile(album, "z.jpg", size: 12_000, seed: 52)
        _ = makeFile(album + "/locked", "x.jpg", size: 1_000, seed: 53)
        chmod(album + "/locked", 0)
        // Listed, but nothing in it can be looked at (no search permission): said, not dropped.
        _ = makeFile(album + "/listed", "y.jpg", size: 1_000, seed: 55)
        chmod(album + "/listed", 0o644)
        let secret = source + "/secret.txt"
        try Data("private".utf8).write(to: URL(fileURLWithPath: secret))
        chmod(secret, 0o600)
        try FileManager.default.createSymbolicLink(atPath: album + "/link.jpg", withDestinationPath: secret)
        #expect(mkfifo(album + "/fifo", 0o644) == 0)
        // A name that is not UTF-8.
        let invalid = Array((album + "/bad").utf8) + [0xFF] + Array(".jpg".utf8) + [0]
        let fd = invalid.withUnsafeBufferPointer { pointer in
            pointer.baseAddress!.withMemoryRebound(to: CChar.self, capacity: invalid.count) { open($0, O_WRONLY | O_CREAT, 0o644) }
        }
        #expect(fd >= 0)
        close(fd)
        for name in ["back\\slash.jpg", "new\nline.jpg", "tab\t.jpg"] {
            _ = makeFile(album, name, size: 100, seed: 54)
        }
        // As root the directory would be readable: the agent runs without its capabilities, as a user would.
        let agent = ["--bounding-set=-all", try Self.agentBinary()]
        let run = try await Self.run("/usr/bin/setpriv", agent + ["send", "--json", album], environment: relay.environment)
        #expect(run.status == 1, "\(run.stderr)")
        let lines = try Self.jsonLines(run.stdout)
        func line(_ suffix: String) -> [String: Any]? { lines.first { ($0["path"] as? String ?? "").hasSuffix(suffix) } }
        #expect(lines.count == 10, "\(run.stdout)")
        #expect(line("/listed/y.jpg")?["status"] as? String == "skipped", "\(run.stdout)")
        #expect(line("/a.jpg")?["status"] as? String == "stored" && line("/z.jpg")?["status"] as? String == "stored")
        for (suffix, reason) in [("/link.jpg", "symbolic link"), ("/locked", "cannot be read"), ("/fifo", "FIFO"), (".jpg", "UTF-8")]
        where suffix != ".jpg" {
            #expect(line(suffix)?["status"] as? String == "skipped", "\(suffix): \(String(describing: line(suffix)))")
            let error = (line(suffix)?["error"] as? String) ?? ""
            #expect(error.contains(reason), "\(suffix): \(String(describing: line(suffix)))")
        }
        #expect(lines.contains { $0["status"] as? String == "skipped" && ($0["error"] as? String ?? "").contains("UTF-8") }, "\(run.stdout)")
        for suffix in ["slash.jpg", "line.jpg", "tab\t.jpg"] {
            #expect(line(suffix)?["status"] as? String == "failed", "\(suffix): \(String(describing: line(suffix)))")
        }
        #expect(FileManager.default.contents(atPath: relay.data + "/store/dev/album/a.jpg") == a.data)
        #expect(FileManager.default.contents(atPath: relay.data + "/store/dev/album/z.jpg") == z.data)
        #expect(!FileManager.default.fileExists(atPath: relay.data + "/store/dev/album/link.jpg"), "a link's target was uploaded")

        // Skipped paths alone: exit 0 with --allow-skipped, 1 without; -L uploads a link's target under the link's name.
        for name in ["back\\slash.jpg", "new\nline.jpg", "tab\t.jpg"] { try FileManager.default.removeItem(atPath: album + "/" + name) }
        chmod(album + "/listed", 0o755)
        let strict = try await Self.run("/usr/bin/setpriv", agent + ["send", "--json", album], environment: relay.environment)
        #expect(strict.status == 1, "\(strict.stderr)")
        let lenient = try await Self.run("/usr/bin/setpriv", agent + ["send", "--json", "--allow-skipped", album], environment: relay.environment)
        #expect(lenient.status == 0, "\(lenient.stderr)")
        let followed = try await Self.run(try Self.agentBinary(), ["send", "--json", "-L", album + "/link.jpg"], environment: relay.environment)
        #expect(followed.status == 0, "\(followed.stderr)")
        #expect(FileManager.default.contents(atPath: relay.data + "/store/dev/link.jpg") == Data("private".utf8))
    }

    @Test("a path named on the command line that is not UTF-8 is skipped with that reason, not reported missing")
    func argumentNotUTF8() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let name = Array((source + "/bad").utf8) + [0xFF] + Array(".jpg".utf8) + [0]
        let fd = name.withUnsafeBufferPointer {
            $0.baseAddress!.withMemoryRebound(to: CChar.self, capacity: name.count) { open($0, O_WRONLY | O_CREAT, 0o644) }
        }
        #expect(fd >= 0)
        close(fd)
        let run = try await Self.run(
            "/bin/sh", ["-c", "exec \"$0\" send --json --no-state \"$(printf '%s/bad\\377.jpg' \"$1\")\"", try Self.agentBinary(), source],
            environment: relay.environment
        )
        #expect(run.status == 1)
        let lines = try Self.jsonLines(run.stdout)
        #expect(lines.count == 1 && lines.first?["status"] as? String == "skipped", "\(run.stdout)")
        let firstError = (lines.first?["error"] as? String) ?? ""
        #expect(firstError.contains("not valid UTF-8"), "\(run.stdout)")
    }

    @Test("the same send twice at once, on one state: each prints exactly one result per file, and every file is stored once")
    func twoSendsAtOnce() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        for index in 0..<60 { _ = makeFile(source + "/twice", "f\(index).jpg", size: 3_000 + index, seed: UInt64(700 + index)) }
        let state = TestRelay.makeDirectory()
        let arguments = ["send", "--json", "--state", state, source + "/twice"]
        let outputs = [source + "/one.out", source + "/two.out"]
        let runs = try outputs.map { output -> Process in
            let process = Process()
            process.executableURL = URL(fileURLWithPath: try Self.agentBinary())
            process.arguments = arguments
            process.environment = ProcessInfo.processInfo.environment.merging(relay.environment) { $1 }
            #expect(FileManager.default.createFile(atPath: output, contents: nil))
            process.standardOutput = FileHandle(forWritingAtPath: output)
            process.standardError = FileHandle.nullDevice
            try process.run()
            return process
        }
        for process in runs { process.waitUntilExit() }
        for (process, output) in zip(runs, outputs) {
            #expect(process.terminationStatus == 0)
            let lines = try Self.jsonLines((try? String(contentsOfFile: output, encoding: .utf8)) ?? "")
            let keys = lines.compactMap { $0["key"] as? String }
            #expect(keys.count == 60 && Set(keys).count == 60, "\(output): \(keys.count) lines, \(Set(keys).count) keys")
        }
    }

    @Test("a file queued by a send that was killed, changed since: the next send uploads it as it is now and says stored")
    func changedSinceQueued() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let file = makeFile(source, "clip.mov", size: 40_000, seed: 91)
        let state = TestRelay.makeDirectory()
        // What a killed send left: the file queued with the fingerprint it had then (another than now).
        let store = try AgentStateStore(directory: state)
        let configuration = AgentConfiguration(
            relayHost: "127.0.0.1", relayPort: relay.port, token: relay.environment["UPLOAD_TOKEN"] ?? "", caPath: relay.environment["UPLOAD_CA"]
        )
        _ = try store.enqueue(
            [QueueEntry(key: "clip.mov", path: file.path, size: 40_000, fingerprint: [1, 2, 3], overwrite: false)],
            target: AgentStateStore.target(of: configuration), skipUnchanged: false, external: false
        )
        let run = try await Self.run(try Self.agentBinary(), ["send", "--json", "--state", state, file.path], environment: relay.environment)
        #expect(run.status == 0, "\(run.stdout) \(run.stderr)")
        let lines = try Self.jsonLines(run.stdout)
        #expect(lines.count == 1 && lines.first?["status"] as? String == "stored", "\(run.stdout)")
        #expect(FileManager.default.contents(atPath: relay.data + "/store/dev/clip.mov") == file.data)
    }

    @Test("a wrong token: every one of 300 files gets a failed result line, the queue's window of 256 and those beyond it alike; none stays queued")
    func wrongTokenReportsEveryFile() async throws {
        let relay = try await DevRelay()
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        for index in 0..<300 { _ = makeFile(source + "/many", "f\(index).txt", size: 10, seed: UInt64(index)) }
        var wrong = relay.environment
        wrong["UPLOAD_TOKEN"] = "upl_wrong"
        let state = TestRelay.makeDirectory()
        let run = try await Self.run(try Self.agentBinary(), ["send", "--json", "--state", state, source + "/many"], environment: wrong)
        #expect(run.status == 3)
        let lines = try Self.jsonLines(run.stdout)
        #expect(lines.count == 300, "\(lines.count) result lines for 300 files")
        #expect(Set(lines.compactMap { $0["key"] as? String }).count == 300)
        #expect(lines.allSatisfy { $0["status"] as? String == "failed" && ($0["error"] as? String ?? "").contains("unknown token") })
        #expect(lines.allSatisfy { $0["error_code"] as? String == "UNAUTHENTICATED" }, "every result, beyond the window too")
        let store = try AgentStateStore(directory: state)
        #expect(try store.items().allSatisfy { $0.status == .failed }, "rows left queued")
    }

    @Test(
        "serve --log-format json: every log line is one JSON object with time, level, label, message and the event's metadata (a key with quotes escaped); a format that is none is a usage error"
    )
    func jsonLogs() async throws {
        let relay = try await DevRelay(["--log-level", "info", "--log-format", "json"])
        defer { relay.stop() }
        let source = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: source) }
        let file = makeFile(source, "say \"hi\".txt", size: 1000, seed: 5)
        let sent = try await Self.run(try Self.agentBinary(), ["send", "--no-state", file.path], environment: relay.environment)
        #expect(sent.status == 0, "\(sent.stderr)")
        relay.stop()
        let lines = relay.child.log.split(separator: "\n").filter { $0.hasPrefix("{") }
        #expect(lines.count >= 3, "\(relay.child.log)")
        var committed: [String: Any]? = nil
        for line in lines {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "not JSON: \(line)")
            #expect(
                object["time"] is String && object["level"] is String && object["label"] as? String == "upload-relay" && object["message"] is String)
            if object["message"] as? String == "upload committed" { committed = object }
        }
        #expect(committed?["upload.key"] as? String == "say \"hi\".txt", "\(String(describing: committed))")
        #expect(committed?["account"] as? String == "dev")
        let scratch = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let bad = try await Self.run(try relayBinary(), ["serve", "--dev", "--data", scratch, "--log-format", "xml"])
        #expect(bad.status == 2 && bad.stderr.contains("--log-format must be text or json"), "\(bad.stderr)")
    }

    @Test("a certificate, key, CA or configuration file that cannot be used is named, with what is wrong with it, never a library's error name")
    func unusableFilesNamed() async throws {
        let home = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: home) }
        let garbage = home + "/garbage.pem"
        try Data("not a certificate\n".utf8).write(to: URL(fileURLWithPath: garbage))
        let dev = DevCertificates.Paths(dataDirectory: home + "/certs")
        try FileManager.default.createDirectory(atPath: dev.directory, withIntermediateDirectories: true)
        try DevCertificates.ensure(dev)
        let relay = try relayBinary()
        let agent = try Self.agentBinary()
        let cases: [(binary: String, arguments: [String], says: String)] = [
            (
                relay, ["serve", "--data", home + "/d", "--listen", "127.0.0.1:0", "--cert", home + "/none.pem", "--key", dev.serverKey],
                "the certificate \(home)/none.pem (--cert) cannot be read: No such file or directory"
            ),
            (
                relay, ["serve", "--data", home + "/d", "--listen", "127.0.0.1:0", "--cert", garbage, "--key", dev.serverKey],
                "the certificate \(garbage) (--cert) is not a PEM certificate chain"
            ),
            (
                relay, ["serve", "--data", home + "/d", "--listen", "127.0.0.1:0", "--cert", dev.serverCertificate, "--key", garbage],
                "the private key \(garbage) (--key) is not a PEM private key"
            ),
            (
                relay, ["serve", "--data", home + "/d", "--listen", "127.0.0.1:0", "--cert", dev.serverCertificate, "--key", dev.caKey],
                "the private key \(dev.caKey) (--key) does not match the certificate \(dev.serverCertificate) (--cert)"
            ),
            (
                agent, ["send", "--no-state", "--relay", "127.0.0.1:1", "--token", "t", "--ca", home + "/none.pem", "/etc/hostname"],
                "cannot read the CA certificate \(home)/none.pem: No such file or directory"
            ),
            (
                agent, ["send", "--no-state", "--relay", "127.0.0.1:1", "--token", "t", "--ca", garbage, "/etc/hostname"],
                "the CA certificate \(garbage) is not a PEM certificate"
            ),
            (
                agent, ["send", "--config", home + "/none.json", "/etc/hostname"],
                "--config \(home)/none.json: cannot read it (No such file or directory)"
            ),
        ]
        for (binary, arguments, says) in cases {
            let run = try await Self.run(binary, arguments)
            #expect(run.status == 1 || run.status == 2, "\(arguments): exit \(run.status)")
            #expect(run.stderr.contains(says), "\(arguments): \(run.stderr)")
            #expect(!run.stderr.contains("failedToLoad") && !run.stderr.contains("NSCocoaErrorDomain"), "\(run.stderr)")
        }
    }

    @Test("usage errors exit 2 and say what is missing")
    func usageErrors() async throws {
        let agent = try Self.agentBinary()
        let noPath = try await Self.run(agent, ["send", "--relay", "127.0.0.1:1", "--token", "t"])
        #expect(noPath.status == 2)
        #expect(noPath.stderr.contains("path"))
        let noToken = try await Self.run(agent, ["send", "--relay", "127.0.0.1:1", "/etc/hostname"])
        #expect(noToken.status == 2)
        #expect(noToken.stderr.contains("UPLOAD_TOKEN"))
        // A path that is not there is an item that failed, not a usage error (the others would go up).
        let missing = try await Self.run(agent, ["send", "--relay", "127.0.0.1:1", "--token", "t", "--no-state", "/no/such/file"])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("/no/such/file") && missing.stderr.contains("no such file"), "\(missing.stderr)")
        let stdinWithoutName = try await Self.run(agent, ["send", "--relay", "127.0.0.1:1", "--token", "t", "-"])
        #expect(stdinWithoutName.status == 2)
        #expect(stdinWithoutName.stderr.contains("--name"))
        let relay = try await Self.run(try relayBinary(), ["serve", "--data", TestRelay.makeDirectory()])
        #expect(relay.status == 2)
        #expect(relay.stderr.contains("--dev"))
    }

    @Test("--help teaches: examples, environment, exit status")
    func help() async throws {
        let help = try await Self.run(try Self.agentBinary(), ["send", "--help"])
        #expect(help.status == 0)
        for needle in ["UPLOAD_TOKEN", "Exit status", "--retry-for", "--json", "--name"] {
            #expect(help.stdout.contains(needle), "help lacks \(needle)")
        }
    }
}
