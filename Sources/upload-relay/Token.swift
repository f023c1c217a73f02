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
        @Option(name: .long, help: ArgumentHelp("Directory the relay owns.", valueName: "dir"))
        var data: String = "./upload-relay-data"

        @Option(
            name: .long,
            help: ArgumentHelp("The relays' shared catalog, postgres://USER:PASSWORD@HOST:PORT/DATABASE (or UPLOAD_RELAY_CATALOG); default: the SQLite catalog in --data.", valueName: "url")
        )
        var catalog: String?

        func openCatalog() throws -> any Catalog {
            let url = self.catalog ?? ProcessInfo.processInfo.environment["UPLOAD_RELAY_CATALOG"]
            // The data directory and catalog a first `token add` creates are private, as `serve` makes them.
            umask(FileModes.private.umask)
            do {
                return try RelayRuntime.openCatalog(dataDirectory: self.data, url: url, logger: Logger(label: "upload-relay"))
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

        func run() throws {
            let catalog = try self.options.openCatalog()
            print("NAME\tUSED\tQUOTA\tSTATE")
            for account in try catalog.accounts() {
                print("\(account.name)\t\(account.usedBytes)\t\(account.quota.map(String.init) ?? "-")\t\(account.revoked ? "revoked" : "active")")
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
