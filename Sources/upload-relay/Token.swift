import ArgumentParser
import Foundation
import Logging
import UploadCommandLine
import UploadRelay
import UploadRelayBackends
import UploadRelayPostgres

struct Token: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage agent accounts and their tokens.",
        discussion: "Tokens are shown once, when made, and stored only hashed in the catalog (<data>/catalog.sqlite, or --catalog).",
        subcommands: [Add.self, List.self, Rotate.self, Quota.self, Disable.self, Enable.self, Revoke.self, Delete.self]
    )

    struct Options: ParsableArguments {
        @Option(name: .long, help: ArgumentHelp("Directory the relay owns (or UPLOAD_RELAY_DATA). Required.", valueName: "dir"))
        var data: String?

        @Option(
            name: .long,
            help: ArgumentHelp(
                "The relays' shared catalog, postgres://USER:PASSWORD@HOST:PORT/DATABASE (or UPLOAD_RELAY_CATALOG); default: the SQLite catalog in --data.",
                valueName: "url")
        )
        var catalog: String?

        func validate() throws {
            guard DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) != nil else { throw DataDirectory.missing }
        }

        var dataDirectory: String { DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) ?? "" }

        func openCatalog() async throws -> any Catalog {
            let url = self.catalog ?? ProcessInfo.processInfo.environment["UPLOAD_RELAY_CATALOG"]
            guard let data = DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) else { throw DataDirectory.missing }
            // The data directory and catalog a first `token add` creates are private, as `serve` makes them.
            umask(FileModes.private.umask)
            do {
                return try await RelayRuntime.openCatalog(dataDirectory: data, url: url, logger: Logger(label: "upload-relay"))
            } catch let error as CatalogError where error.isUnavailable {
                throw ValidationError("--catalog: \(error)")
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make an account and print its new token (once).")

        @Argument(help: "Account name, such as the device's name.")
        var name: String

        @Option(name: .long, help: ArgumentHelp("Most bytes the account may store, e.g. 50G.", valueName: "bytes"))
        var quota: String?

        @OptionGroup var options: Options

        func run() async throws {
            let catalog = try await self.options.openCatalog()
            let quota = try self.quota.map { try ByteCount.parse($0, option: "--quota") }
            let token = Tokens.generate()
            do {
                try await catalog.addAccount(name: self.name, tokenHash: Tokens.hash(Array(token.utf8)), quota: quota)
            } catch let error as CatalogError where !error.isUnavailable {
                throw ValidationError(error.description)
            }
            print(token)
            FileHandle.standardError.write(
                Data("token for account \"\(self.name)\" (shown once; give it to the agent as --token or UPLOAD_TOKEN)\n".utf8))
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List accounts, their quotas and use.")

        @OptionGroup var options: Options

        @Flag(
            name: .long,
            help:
                "One JSON object per account: {\"name\", \"used_bytes\", \"quota_bytes\" (null: none), \"objects\", \"stored_bytes\", \"uploading\", \"uploading_bytes\", \"state\": \"active\"|\"revoked\"}."
        )
        var json = false

        @Flag(name: .long, help: "Exact byte counts in the table instead of KiB, MiB, GiB.")
        var bytes = false

        func run() async throws {
            let catalog = try await self.options.openCatalog()
            let accounts = try await catalog.accounts()
            // What each account stores and has under way, from the catalog's rows.
            var objects: [String: (count: Int, bytes: Int64)] = [:]
            for object in try await catalog.objects() {
                objects[object.account, default: (0, 0)].count += 1
                objects[object.account, default: (0, 0)].bytes += object.size
            }
            var uploading: [String: (count: Int, bytes: Int64)] = [:]
            for session in try await catalog.sessions(updatedBefore: .distantFuture) {
                uploading[session.account, default: (0, 0)].count += 1
                uploading[session.account, default: (0, 0)].bytes += session.durableOffset
            }
            guard self.json else {
                let shown: (Int64) -> String = self.bytes ? { String($0) } : { Format.bytes($0) }
                print("NAME\tUSED\tQUOTA\tOBJECTS\tUPLOADING\tSTATE")
                for account in accounts {
                    let stored = objects[account.name] ?? (0, 0)
                    let under = uploading[account.name] ?? (0, 0)
                    print(
                        "\(account.name)\t\(shown(account.usedBytes))\t\(account.quota.map(shown) ?? "-")\t\(stored.count)\t\(under.count)\t\(account.revoked ? "revoked" : "active")"
                    )
                }
                return
            }
            for account in accounts {
                let stored = objects[account.name] ?? (0, 0)
                let under = uploading[account.name] ?? (0, 0)
                let object: [String: Any] = [
                    "name": account.name, "used_bytes": account.usedBytes, "quota_bytes": account.quota.map { $0 as Any } ?? NSNull(),
                    "objects": stored.count, "stored_bytes": stored.bytes, "uploading": under.count, "uploading_bytes": under.bytes,
                    "state": account.revoked ? "revoked" : "active",
                ]
                let line = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
                print(String(decoding: line, as: UTF8.self))
            }
        }
    }

    /// Applies a change to account `name`, or fails naming it when there is no such account. A change that ends what
    /// its open connections may do (a new token, disabled) returns once every running relay has closed them: then
    /// the words for it.
    @discardableResult
    static func update(
        _ name: String, _ options: Options, quota: Int64?? = nil, tokenHash: [UInt8]? = nil, revoked: Bool? = nil
    ) async throws -> String {
        let catalog = try await options.openCatalog()
        defer { (catalog as? PostgresCatalog)?.shutdown() }
        guard try await catalog.updateAccount(named: name, quota: quota, tokenHash: tokenHash, revoked: revoked) else {
            throw ValidationError(CatalogError.unknownAccount(name).description)
        }
        guard tokenHash != nil || revoked == true else { return "" }
        return Self.words(try await RelayAdmin.waitForLooks(catalog: catalog, after: try await catalog.clock()))
    }

    /// What the running relays did with the connections of a principal that is gone.
    static func words(_ looks: RelayAdmin.Looks) -> String {
        switch (looks.told, looks.silent) {
        case (0, 0): return ""
        case (let told, 0): return "; \(told == 1 ? "the running relay has" : "the \(told) running relays have") closed its connections"
        case (_, let silent):
            return "; \(silent) running relays did not answer within 30 s: they close its connections at their next look at the catalog"
        }
    }

    static func say(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }

    struct Rotate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Give an account a new token and print it (once); the old one is refused from then on.",
            discussion:
                "Running relays close the connections made with the old token within seconds (the agent reconnects with the new one once it has it)."
        )

        @Argument(help: "Account name.")
        var name: String

        @OptionGroup var options: Options

        func run() async throws {
            let token = Tokens.generate()
            let relays = try await Token.update(self.name, self.options, tokenHash: Tokens.hash(Array(token.utf8)))
            print(token)
            Token.say("new token for account \"\(self.name)\" (shown once); the old one is refused from now on" + relays)
        }
    }

    struct Quota: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Set or remove an account's quota.",
            discussion: "A quota below what the account stores already keeps what is stored and refuses what would add to it."
        )

        @Argument(help: "Account name.")
        var name: String

        @Argument(help: ArgumentHelp("Most bytes the account may store, e.g. 50G; none for no limit.", valueName: "size|none"))
        var size: String

        @OptionGroup var options: Options

        func run() async throws {
            let quota: Int64? = self.size == "none" ? nil : try ByteCount.parse(self.size, option: "SIZE")
            try await Token.update(self.name, self.options, quota: .some(quota))
            Token.say("account \"\(self.name)\": quota \(quota.map { "\(Format.bytes($0)) (\($0) bytes)" } ?? "none")")
        }
    }

    struct Disable: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Refuse an account's token until enable: new connections are refused, open ones close within seconds."
        )

        @Argument(help: "Account name.")
        var name: String

        @OptionGroup var options: Options

        func run() async throws {
            let relays = try await Token.update(self.name, self.options, revoked: true)
            Token.say("account \"\(self.name)\" disabled: its token is refused until `token enable`" + relays)
        }
    }

    struct Enable: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Accept a disabled (or revoked) account's token again.")

        @Argument(help: "Account name.")
        var name: String

        @OptionGroup var options: Options

        func run() async throws {
            try await Token.update(self.name, self.options, revoked: false)
            Token.say("account \"\(self.name)\" enabled: its token is accepted again")
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Revoke an account's token: new connections are refused, open ones close within seconds (as disable; enable undoes it)."
        )

        @Argument(help: "Account name.")
        var name: String

        @OptionGroup var options: Options

        func run() async throws {
            let catalog = try await self.options.openCatalog()
            defer { (catalog as? PostgresCatalog)?.shutdown() }
            guard try await catalog.revokeAccount(named: self.name) else {
                throw ValidationError(CatalogError.unknownAccount(self.name).description)
            }
            let relays = Token.words(try await RelayAdmin.waitForLooks(catalog: catalog, after: try await catalog.clock()))
            Token.say("revoked the token of account \"\(self.name)\"" + relays)
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete an account: its token, its uploads under way and, as you choose, its objects.",
            discussion: """
                Say what happens to the account's objects: --delete-objects removes each from the store and the \
                catalog (as rm does), --keep-objects leaves the files or S3 objects where they are and forgets them. \
                Without either, nothing is changed and the account's objects are counted for you to choose. The \
                token is refused first (running relays close its connections), its uploads under way are dropped \
                with their staged bytes, then the account goes and its name may be given again. Pass the --store \
                (and --s3-endpoint) that serve uses.
                """
        )

        @Argument(help: "Account name.")
        var name: String

        @Flag(name: .long, help: "Remove the account's objects from the store and the catalog.")
        var deleteObjects = false

        @Flag(name: .long, help: "Leave the account's objects in the store, forgotten by the catalog.")
        var keepObjects = false

        @OptionGroup var options: Options
        @OptionGroup var storeOptions: StoreOptions

        func validate() throws {
            guard !(self.deleteObjects && self.keepObjects) else { throw ValidationError("--delete-objects or --keep-objects, not both") }
        }

        func run() async throws {
            let catalog = try await self.options.openCatalog()
            defer { (catalog as? PostgresCatalog)?.shutdown() }
            guard try await catalog.account(named: self.name) != nil else {
                throw ValidationError(CatalogError.unknownAccount(self.name).description)
            }
            guard self.deleteObjects || self.keepObjects else {
                let objects = try await catalog.objects().filter { $0.account == self.name }
                let bytes = objects.reduce(Int64(0)) { $0 + $1.size }
                throw ValidationError(
                    "account \"\(self.name)\" has \(objects.count) objects (\(Format.bytes(bytes))): say what happens to them, --delete-objects (removed from the store) or --keep-objects (left in the store, forgotten); nothing was changed"
                )
            }
            let logger = Logger(label: "upload-relay")
            let store = try self.storeOptions.openStore(data: self.options.dataDirectory, catalog: catalog, logger: logger)
            let outcome = try await RelayAdmin.deleteAccount(
                self.name, objects: self.deleteObjects ? .delete : .keep, catalog: catalog, store: store, logger: logger
            )
            var words: [String] = []
            if outcome.uploadsDropped > 0 { words.append("\(outcome.uploadsDropped) uploads under way dropped") }
            if self.deleteObjects { words.append("\(outcome.removed) objects removed (\(Format.bytes(outcome.removedBytes)))") }
            if self.keepObjects { words.append("\(outcome.kept) objects left in the store") }
            for (key, reason) in outcome.refused { Token.say("left \(key): \(reason)") }
            guard outcome.deleted else {
                Token.say(
                    "account \"\(self.name)\" is disabled but not deleted: \(outcome.refused.count) objects could not be removed; \(words.joined(separator: ", "))"
                )
                throw ExitCode(1)
            }
            Token.say("account \"\(self.name)\" deleted" + (words.isEmpty ? "" : ": " + words.joined(separator: ", ")) + Token.words(outcome.looks))
        }
    }
}
