import ArgumentParser
import Foundation
import Logging
import UploadCommandLine
import UploadRelay

struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage agent accounts and their tokens.",
        discussion: "Tokens are shown once, when made, and stored only hashed in the catalog (<data>/catalog.sqlite, or --catalog).",
        subcommands: [Add.self, List.self, Revoke.self]
    )

    struct Options: ParsableArguments {
        @Option(name: .long, help: ArgumentHelp("Directory the relay owns (or UPLOAD_RELAY_DATA). Required.", valueName: "dir"))
        var data: String?

        @Option(
            name: .long,
            help: ArgumentHelp("The relays' shared catalog, postgres://USER:PASSWORD@HOST:PORT/DATABASE (or UPLOAD_RELAY_CATALOG); default: the SQLite catalog in --data.", valueName: "url")
        )
        var catalog: String?

        func validate() throws {
            guard DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) != nil else { throw DataDirectory.missing }
        }

        func openCatalog() throws -> any Catalog {
            let url = self.catalog ?? ProcessInfo.processInfo.environment["UPLOAD_RELAY_CATALOG"]
            guard let data = DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) else { throw DataDirectory.missing }
            // The data directory and catalog a first `token add` creates are private, as `serve` makes them.
            umask(FileModes.private.umask)
            do {
                return try RelayRuntime.openCatalog(dataDirectory: data, url: url, logger: Logger(label: "upload-relay"))
            } catch let error as CatalogFailure {
                throw ValidationError("--catalog: \(error)")
            }
        }
    }

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make an account and print its new token (once).")

        @Argument(help: "Account name, such as the device's name.")
        var name: String

        @Option(name: .long, help: ArgumentHelp("Most bytes the account may store, e.g. 50G.", valueName: "bytes"))
        var quota: String?

        @OptionGroup var options: Options

        func run() throws {
            let catalog = try self.options.openCatalog()
            let quota = try self.quota.map { try ByteCount.parse($0, option: "--quota") }
            let token = Tokens.generate()
            do {
                try catalog.addAccount(name: self.name, tokenHash: Tokens.hash(Array(token.utf8)), quota: quota)
            } catch let error as CatalogError {
                throw ValidationError(error.description)
            }
            print(token)
            FileHandle.standardError.write(Data("token for account \"\(self.name)\" (shown once; give it to the agent as --token or UPLOAD_TOKEN)\n".utf8))
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List accounts, their quotas and use.")

        @OptionGroup var options: Options

        @Flag(name: .long, help: "One JSON object per account: {\"name\", \"used_bytes\", \"quota_bytes\" (null: none), \"state\": \"active\"|\"revoked\"}.")
        var json = false

        func run() throws {
            let catalog = try self.options.openCatalog()
            let accounts = try catalog.accounts()
            guard self.json else {
                print("NAME\tUSED\tQUOTA\tSTATE")
                for account in accounts {
                    print("\(account.name)\t\(account.usedBytes)\t\(account.quota.map(String.init) ?? "-")\t\(account.revoked ? "revoked" : "active")")
                }
                return
            }
            for account in accounts {
                let object: [String: Any] = [
                    "name": account.name, "used_bytes": account.usedBytes, "quota_bytes": account.quota.map { $0 as Any } ?? NSNull(),
                    "state": account.revoked ? "revoked" : "active",
                ]
                let line = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
                print(String(decoding: line, as: UTF8.self))
            }
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke an account's token: new connections are refused.")

        @Argument(help: "Account name.")
        var name: String

        @OptionGroup var options: Options

        func run() throws {
            let catalog = try self.options.openCatalog()
            guard try catalog.revokeAccount(named: self.name) else {
                throw ValidationError(CatalogError.unknownAccount(self.name).description)
            }
            FileHandle.standardError.write(Data("revoked the token of account \"\(self.name)\"\n".utf8))
        }
    }
}
