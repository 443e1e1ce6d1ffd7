// ESLint for the extension's TypeScript, set up as the JupyterLab extension template does
// (typescript-eslint's recommended rules, Prettier as a rule, the template's naming and
// quoting rules). `jlpm lint:check` runs it with Prettier; `jlpm lint` fixes what it can.
import js from '@eslint/js';
import prettierRecommended from 'eslint-plugin-prettier/recommended';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules', 'lib', 'coverage', '**/*.js', '**/*.d.ts'] },
  js.configs.recommended,
  tseslint.configs.recommended,
  {
    files: ['src/**/*.ts', 'src/**/*.tsx'],
    languageOptions: {
      globals: { ...globals.browser, ...globals.es2015 },
      parserOptions: { project: 'tsconfig.eslint.json', sourceType: 'module' }
    },
    rules: {
      // JupyterLab's convention: interfaces are IName.
      '@typescript-eslint/naming-convention': [
        'error',
        {
          selector: 'interface',
          format: ['PascalCase'],
          custom: { regex: '^I[A-Z]', match: true }
        }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      '@typescript-eslint/no-use-before-define': 'off',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  prettierRecommended
);
